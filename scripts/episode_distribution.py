"""Episode distribution under stock trl.GRPOTrainer vs ThunderSync (agent_protocol="trl" and "paper"), same model.

The warm-started tiny agent (`tiny/agent.py`) samples episodes with two canned tools (no sandbox) from the
same prompts; stock TRL generates with its own tool loop (`GRPOTrainer._generate`, transformers generation), and
ThunderSync with its agent engine. Sampling streams differ (TRL samples a padded batch, ThunderSync per trajectory),
so episodes are compared as distributions: turns, tool calls, model tokens (tool mask 1), tool-result tokens (mask
0) and all completion tokens per episode, with the mean of each and a two-sample Kolmogorov–Smirnov test (asymptotic
p-value). With `--top_k 1` sampling is greedy and the script also reports the share of episodes that are
token-identical to stock TRL's.

`--env swe` replaces the canned tools by the real environment of `benchmarks/realgen.py`: `SWERepairEnv` on the bundled
SWE repair tasks (bubblewrap-sandboxed `run_shell`, real pytest output), one row per task and `--generations` per
row, prompts from `swe_dataset`; episodes only, no grading. `--engine auto` samples ThunderSync's episodes through
the default engine (the embedded vLLM-API server, as realgen does) instead of the in-process `local_thread` engine.
Both sample from the initial weights: the first step of a run, before any policy drift.

    PYTHONPATH=. python scripts/episode_distribution.py --prompts 16 --generations 8 --out outputs/episodes.json
    PYTHONPATH=. python scripts/episode_distribution.py --env swe --generations 4 --max_tool_calling_iterations 5 \
        --engine auto --protocols trl
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import torch


class CannedShellEnv:
    """A TRL environment with the tiny agent's two tools; deterministic canned results."""

    def reset(self, **row) -> None:
        self.calls = 0

    def run_shell(self, command: str) -> str:
        """Run a shell command in the task workspace (/workspace) and return its exit code and output.

        Args:
            command: The shell command to run.
        """
        self.calls += 1
        return "exit_code: 0\nstdout:\nok" if self.calls % 2 else "exit_code: 1\nstdout:\n1 failed, 2 passed in 0.1s"

    def submit(self) -> str:
        """Submit the current state of the workspace as the final answer."""
        return "submitted"

    def get_reward(self) -> float:
        return 0.0


KEYS = ("turns", "tool_calls", "model_tokens", "tool_tokens", "completion_tokens")


def episode_stats(messages: list[dict], mask: list[int], ids: list[int]) -> dict:
    """The same measures for both trainers, from the reward-function messages, the tool mask and the ids."""
    runs = sum(1 for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] == 0))
    return {"turns": runs, "tool_calls": sum(1 for m in messages if m.get("role") == "tool"),
            "model_tokens": sum(mask), "tool_tokens": len(mask) - sum(mask), "completion_tokens": len(mask),
            "ids": list(ids), "mask": list(mask)}


def ks_test(a: list[float], b: list[float]) -> tuple[float, float]:
    """Two-sample Kolmogorov–Smirnov statistic and its asymptotic p-value."""
    values = sorted(set(a) | set(b))
    d = max(abs(sum(x <= v for x in a) / len(a) - sum(x <= v for x in b) / len(b)) for v in values)
    if d == 0:
        return 0.0, 1.0
    n = len(a) * len(b) / (len(a) + len(b))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(1.0, max(0.0, p))


def rows(n: int, generations: int) -> list[dict]:
    from trl_thundersync.tiny.agent import _task_prompts

    prompts = _task_prompts()[:n]
    return [{"prompt": [{"role": "user", "content": p}]} for p in prompts for _ in range(generations)]


def swe_rows(n: int | None, generations: int) -> list[dict]:
    """realgen's dataset: one row per bundled SWE task (its prompt and task_id), each `generations` times."""
    from trl_thundersync.envs.tasks import swe_dataset

    dataset = swe_dataset()
    chosen = [dataset[i] for i in range(len(dataset) if n is None else min(n, len(dataset)))]
    return [dict(row) for row in chosen for _ in range(generations)]


def environment_factory(args):
    if args.env == "canned":
        return CannedShellEnv
    from trl_thundersync.envs.environments.swe import SWERepairEnv

    return SWERepairEnv


def close_environments(envs) -> None:
    for env in envs:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def common(args, out: Path) -> dict:
    return dict(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=8,
                num_generations=args.generations, max_completion_length=args.max_completion_length,
                max_tool_calling_iterations=args.max_tool_calling_iterations, seed=args.seed,
                gradient_checkpointing=False, temperature=1.0, top_k=args.top_k)


def zero(completions, **kwargs):
    return [0.0] * len(completions)


def stock_trl(args, model_path: str, tokenizer, batch: list[dict], out: Path) -> list[dict]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    factory = environment_factory(args)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_path), reward_funcs=[zero],
                          args=GRPOConfig(**common(args, out)), train_dataset=Dataset.from_list(batch),
                          processing_class=tokenizer, environment_factory=factory)
    stats = []
    for start in range(0, len(batch), args.chunk):  # what _generate_and_score_completions does before _generate
        inputs = batch[start:start + args.chunk]
        torch.manual_seed(args.seed + start)
        envs = [factory() for _ in inputs]
        prompts = []
        for env, x in zip(envs, inputs, strict=True):
            observation = env.reset(**x)
            prompt = x["prompt"]
            if observation is not None:
                prompt = prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + observation}]
            prompts.append(prompt)
        trainer.environments = envs
        trainer._batch_environments = [None] * len(inputs)
        trainer._sync_tool_dicts = [{"run_shell": e.run_shell, "submit": e.submit} for e in envs]
        trainer._async_tool_dicts = [{} for _ in envs]
        try:
            _, completion_ids, tool_mask, completions, *_ = trainer._generate(prompts)
        finally:
            close_environments(envs)
        stats += [episode_stats(c, list(m), list(i))
                  for c, m, i in zip(completions, tool_mask, completion_ids, strict=True)]
    return stats


def thundersync(args, model_path: str, tokenizer, batch: list[dict], out: Path, protocol: str) -> list[dict]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

    fields = common(args, out)
    if protocol == "paper":  # its turn cap from TRL's field; per-turn and trajectory budgets max_completion_length
        fields.update(agent_protocol="paper")
    config = ThunderSyncGRPOConfig(**fields, rollout_engine=args.engine)
    trainer = ThunderSyncGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_path), reward_funcs=[zero],
                                     args=config, train_dataset=Dataset.from_list(batch), processing_class=tokenizer,
                                     environment_factory=environment_factory(args))
    engine = trainer._rollout_engine()
    stats = []
    try:
        for start in range(0, len(batch), args.chunk):
            inputs = batch[start:start + args.chunk]
            requests = trainer._requests(inputs, [x["prompt"] for x in inputs], trainer.policy_version)
            requests = [r.__class__(**{**r.__dict__, "seed": r.seed + start}) for r in requests]
            engine.start_batch(requests, trainer.policy_version)
            rollouts = sorted(engine.results(), key=lambda r: r.index)
            stats += [episode_stats(r.completion, list(r.env_mask), list(r.completion_ids)) for r in rollouts]
    finally:
        close_environments(getattr(engine, "environments", ()))
        engine.close()
    return stats


def summarize(name: str, stats: list[dict], reference: list[dict] | None) -> dict:
    out = {"trainer": name, "episodes": len(stats)}
    for key in KEYS:
        values = [s[key] for s in stats]
        out[f"{key}_mean"] = sum(values) / len(values)
        if reference is not None:
            out[f"{key}_ks"], out[f"{key}_p"] = ks_test(values, [s[key] for s in reference])
    if reference is not None:  # with --top_k 1 (greedy) the episodes themselves can be compared
        out["identical_episodes"] = sum(a["ids"] == b["ids"] and a["mask"] == b["mask"]
                                        for a, b in zip(stats, reference, strict=True)) / len(stats)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=("canned", "swe"), default="canned",
                        help="canned: two canned tools; swe: SWERepairEnv, the bundled tasks, sandboxed shell")
    parser.add_argument("--engine", default="local_thread", help="ThunderSync rollout_engine (auto: embedded server)")
    parser.add_argument("--protocols", default="trl,paper", help="ThunderSync agent_protocol values to sample")
    parser.add_argument("--prompts", type=int, default=None, help="first N prompts (default 16; swe: all tasks)")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=32, help="trajectories per generation call")
    parser.add_argument("--max_completion_length", type=int, default=256)
    parser.add_argument("--max_tool_calling_iterations", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top_k", type=int, default=0, help="1: greedy, episodes comparable one by one")
    parser.add_argument("--model", default=None, help="tiny agent folder (built and cached if missing)")
    parser.add_argument("--out", default="outputs/episode_distribution.json")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from trl_thundersync.tiny.agent import save_tiny_agent_model

    model_path = str(save_tiny_agent_model(args.model or Path(tempfile.gettempdir()) / "thundersync-tiny-agent"))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if args.env == "swe":
        batch = swe_rows(args.prompts, args.generations)
    else:
        batch = rows(16 if args.prompts is None else args.prompts, args.generations)
    work = Path(tempfile.mkdtemp(prefix="episodes-"))
    trl_stats = stock_trl(args, model_path, tokenizer, batch, work / "trl")
    table = [summarize("trl.GRPOTrainer", trl_stats, None)]
    for protocol in [p.strip() for p in args.protocols.split(",") if p.strip()]:
        stats = thundersync(args, model_path, tokenizer, batch, work / protocol, protocol)
        table.append(summarize(f"ThunderSync agent_protocol={protocol!r}", stats, trl_stats))
    keys = KEYS
    print(f"{'trainer':38s} " + " ".join(f"{k + ' mean (KS p)':>26s}" for k in keys))
    for row in table:
        cells = [f"{row[k + '_mean']:8.2f}" + (f" ({row[k + '_p']:.3f})" if k + "_p" in row else "")
                 for k in keys]
        same = f"  identical episodes {row['identical_episodes']:.1%}" if "identical_episodes" in row else ""
        print(f"{row['trainer']:38s} " + " ".join(f"{c:>26s}" for c in cells) + same)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "table": table}, indent=2))


if __name__ == "__main__":
    main()
