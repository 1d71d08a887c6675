"""Peak memory against the plan at the sizes users train: Qwen3-shaped random models, sync vs thundersync vs TRL.

    python -m benchmarks.memory_ladder [--sizes 1m,10m,43m,100m] [--steps 3] [--out outputs/memory_ladder.json]

For each size, a model from the tiny builder (vocabulary 512, `intermediate_size` 2·hidden) trains a plain GRPO run
with the defaults of the issue that asked for it (issue 40): 16 trajectories per step in groups of 8, AdamW, FP32,
completions of 2–24 scripted tokens (every trainer samples the same ones through TRL's `rollout_func`, so no
generation memory is counted), one learner process. Each run is its own process, so its peak resident set
(`ru_maxrss`) is its own:
- `trl`: stock `trl.GRPOTrainer`;
- `sync`: ThunderSync with `schedule="sync"`;
- `thundersync`: ThunderSync with its defaults (content release, `memory_budget="auto"`);
- `thundersync/no-budget`: the same with `memory_budget=None` (every trajectory may hold a release buffer);
- `thundersync/lagging-rewards`: the defaults, with a reward function that takes 20 ms per completion, so the
  rewards come after the completions and content release holds the buffers the budget allows (the other runs'
  rewards come with their completions).

Printed per run: parameters, peak RSS, its ratio to sync's, the plan's peak for the run (a prediction, with the
framework line measured before training) and its ratio to the measured peak, how far the peak grew over the
resident set before `train()` (the model is resident by then) beside the plan's bytes still to allocate then
(gradients, optimizer state, streamed state: the prediction of that growth), the caps the budget chose, and the
final parameters' relative distance to sync's (the same update), and the median step time after the first step
(TRL's logged `step_time`) beside its ratio to sync's: a scripted workload whose rollouts take no time, so it
measures the learner's cost, not the overlap (the overlap: `python -m benchmarks`).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = {"1m": (128, 4), "10m": (384, 6), "43m": (768, 8), "100m": (1024, 10)}  # (hidden_size, layers)
RUNS = ("trl", "sync", "thundersync", "thundersync/no-budget", "thundersync/lagging-rewards")
REWARD_LAG_S = 0.02  # lagging-rewards: seconds the reward function takes per completion


def child(kind: str, model_dir: str, steps: int, out: str) -> None:
    """One run in this process; writes its figures to `out` (JSON)."""
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.parity import cpu_config, load_model, prompt_dataset, reward_len, scripted_rollout_func
    from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
    from trl_thundersync.memory.available import pending_bytes

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    common = dict(per_device_train_batch_size=16, num_generations=8, max_completion_length=32, max_steps=steps,
                  optim="adamw_torch", learning_rate=1e-5, logging_steps=1)
    if kind == "trl":
        trainer_cls, args = GRPOTrainer, cpu_config(GRPOConfig, Path(out).parent / "trl", **common)
    else:
        extra = {"sync": dict(schedule="sync"), "thundersync": {}, "thundersync/lagging-rewards": {},
                 "thundersync/no-budget": dict(memory_budget=None)}[kind]
        trainer_cls = ThunderSyncGRPOTrainer
        args = cpu_config(ThunderSyncGRPOConfig, Path(out).parent / kind.replace("/", "-"), **common, **extra)
    model = load_model(model_dir)
    reward = lagging_reward_len if kind == "thundersync/lagging-rewards" else reward_len
    trainer = trainer_cls(model=model, reward_funcs=[reward], args=args, train_dataset=prompt_dataset(16),
                          processing_class=tokenizer,
                          rollout_func=scripted_rollout_func(tokenizer, max_len=24, vocab_low=10, with_eos=0.5))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    plan = getattr(trainer, "memory_plan", None)
    schedule = "sync" if kind == "sync" else "thundersync"
    params = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    torch.save(params, Path(out).with_suffix(".pt"))
    steps_s = [row["step_time"] for row in trainer.state.log_history if "step_time" in row][1:]  # after the first
    Path(out).write_text(json.dumps({
        "kind": kind, "num_params": params.numel(), "peak_rss": peak, "rss_before_train": before,
        "step_seconds": sorted(steps_s)[len(steps_s) // 2] if steps_s else None,
        "plan_total": plan.total(schedule) if plan else None,
        "plan_pending": pending_bytes(plan, schedule) if plan else None,
        "caps": [trainer.args.max_open_groups, trainer.args.max_buffered_trajectories, trainer.args.release]
        if plan else None}))


def lagging_reward_len(completion_ids, **kwargs) -> list[float]:
    """`reward_len`, REWARD_LAG_S per completion later: the rewards come after the completions, so content release
    holds its buffers while they are computed."""
    import time

    from benchmarks.parity import reward_len

    time.sleep(REWARD_LAG_S * len(completion_ids))
    return reward_len(completion_ids, **kwargs)


lagging_reward_len.__name__ = "reward_len"  # the same metric names as the other runs


def run(sizes: list[str], steps: int, work: Path) -> list[dict]:
    from trl_thundersync.tiny.model import save_tiny_model

    rows = []
    for size in sizes:
        hidden, layers = SIZES[size]
        model_dir = str(save_tiny_model(work / f"model-{size}", hidden_size=hidden, num_layers=layers))
        for kind in RUNS:
            out = work / size / f"{kind.replace('/', '-')}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "benchmarks.memory_ladder", "--child", kind, model_dir, str(steps),
                            str(out)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            row = json.loads(out.read_text())
            row["size"] = size
            rows.append(row)
        _compare(rows[-len(RUNS):], work / size)
    return rows


def _compare(rows: list[dict], folder: Path) -> None:
    import torch

    sync = next(r for r in rows if r["kind"] == "sync")
    reference = torch.load(folder / "sync.pt")
    for row in rows:
        params = torch.load(folder / f"{row['kind'].replace('/', '-')}.pt")
        row["params_rel_to_sync"] = float((params - reference).norm() / reference.norm())
        row["peak_over_sync"] = row["peak_rss"] / sync["peak_rss"]
        both = row.get("step_seconds") and sync.get("step_seconds")
        row["step_over_sync"] = row["step_seconds"] / sync["step_seconds"] if both else None


def table(rows: list[dict]) -> str:
    lines = [f"{'size':>5} {'run':<30} {'params':>12} {'peak RSS MB':>12} {'x sync':>7} {'plan MB':>8} "
             f"{'plan/peak':>9} {'grown MB':>9} {'planned growth MB':>18} {'caps (groups, buffers, release)':<32} "
             f"{'Δθ vs sync':>10} {'step s':>7} {'x sync':>7}"]
    for r in rows:
        plan = f"{r['plan_total'] / 2**20:8.0f}" if r["plan_total"] else f"{'-':>8}"
        ratio = f"{r['plan_total'] / r['peak_rss']:9.2f}" if r["plan_total"] else f"{'-':>9}"
        pending = f"{r['plan_pending'] / 2**20:18.0f}" if r["plan_pending"] else f"{'-':>18}"
        grown = (r["peak_rss"] - r["rss_before_train"]) / 2**20
        lines.append(f"{r['size']:>5} {r['kind']:<30} {r['num_params']:>12,} {r['peak_rss'] / 2**20:12.0f} "
                     f"{r['peak_over_sync']:7.2f} {plan} {ratio} {grown:9.0f} {pending} {str(r['caps'] or '-'):<32} "
                     f"{r['params_rel_to_sync']:10.1e} {_num(r.get('step_seconds'), 7, 3)} "
                     f"{_num(r.get('step_over_sync'), 7, 2)}")
    return "\n".join(lines)


def _num(value, width: int, digits: int) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(*argv[1:3], int(argv[3]), argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1m,10m,43m,100m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("outputs/memory_ladder.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        rows = run(args.sizes.split(","), args.steps, Path(work))
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
