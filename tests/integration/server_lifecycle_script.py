"""A tiny GRPO run on one embedded rollout server, for the lifecycle tests (signals, server crashes, temp folders).

    python server_lifecycle_script.py MODEL_DIR OUT_DIR [--kill-server-at-step K] [--engine managed_vllm]

Launched by test_server_lifecycle.py. Writes `OUT_DIR/in_batch` (the trainer's pid) when the first reward of the
first batch is scored, i.e. while the rest of the batch is still being generated: the test signals the process then.
With `--kill-server-at-step K` the script itself SIGKILLs its embedded server in the middle of batch K (the first
reward of that batch); with `--engine managed_vllm` (tests/real_vllm/test_managed.py) the rollout servers are real
`vllm serve` processes and the one killed is vLLM's API server under its guard. At the end it saves the trained
parameters and every step's sampled completions (as a set)
to `OUT_DIR/result.pt`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from benchmarks.parity import cpu_config, load_model, prompt_dataset
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer


def server_pids(parent: int, marker: bytes = b"trl_thundersync.serve") -> list[int]:
    """Pids of the children of process `parent` whose command line contains `marker` (default: the embedded rollout
    servers, `python -m trl_thundersync.serve`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):  # not a process, or it exited meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and marker in cmdline:
            pids.append(int(entry.name))
    return pids


def vllm_api_server_pids(parent: int) -> list[int]:
    """vLLM's API server of each managed server started by `parent` (the child of its guard)."""
    return [pid for guard in server_pids(parent, b"vllm_guard") for pid in server_pids(guard, b"vllm")]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--kill-server-at-step", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--restarts", type=int, default=None, help="rollout_server_restarts (default: the config's)")
    parser.add_argument("--engine", default="embedded_server", help="rollout_engine")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    scored: list[int] = []
    samples: dict[int, list[tuple[int, ...]]] = {}  # step -> completions in arrival order
    trainer: ThunderSyncGRPOTrainer | None = None

    def reward(completions, completion_ids, **kwargs):
        if not scored:
            (args.out / "in_batch").write_text(str(os.getpid()))
        step = trainer.state.global_step
        if args.kill_server_at_step == step and step not in scored:
            find = vllm_api_server_pids if args.engine != "embedded_server" else server_pids
            (pid,) = find(os.getpid())
            os.kill(pid, signal.SIGKILL)
        scored.append(step)
        samples.setdefault(step, []).extend(tuple(c) for c in completion_ids)
        return [float(len(c)) for c in completions]

    # 8 trajectories of up to 128 tokens, 2 decoded at a time: the batch takes seconds, and at its first reward
    # requests are in flight and others wait in the client
    overrides = dict(rollout_engine=args.engine, max_completion_length=128, per_device_train_batch_size=8,
                     num_generations=2, max_steps=args.max_steps, optim="sgd", learning_rate=0.05,
                     rollout_max_in_flight=2)
    if args.restarts is not None:
        overrides["rollout_server_restarts"] = args.restarts
    trainer = ThunderSyncGRPOTrainer(model=load_model(args.model), reward_funcs=[reward],
                                     args=cpu_config(ThunderSyncGRPOConfig, args.out / "run", **overrides),
                                     train_dataset=prompt_dataset(16), processing_class=tokenizer)
    trainer.train()
    params = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    restarts = max(h.get("rollout/replica0/restarts", 0.0) for h in trainer.state.log_history)
    differences = [h["sampling/sampling_logp_difference/max"] for h in trainer.state.log_history
                   if "sampling/sampling_logp_difference/max" in h]  # vLLM engines: sampler vs learner
    torch.save({"params": params, "samples": {k: sorted(v) for k, v in samples.items()}, "restarts": restarts,
                "engine": trainer.args.resolved_rollout_engine(), "logp_differences": differences},
               args.out / "result.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
