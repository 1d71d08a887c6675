"""Side-by-side step wall time of `schedule="sync"` and `"thundersync"` on the toy workload (same seeds).

    python -m benchmarks.schedules [--steps 6] [--repeats 2] [--engine local_process]

Runs are interleaved (sync, thundersync, sync, ...) so machine noise hits both; the first step of every run is
dropped (worker start-up). Prints mean step wall time, rollout time R, learner busy time L, learner tail and the
speedup, and writes JSON. A quick figure for one machine, not the full benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
from pathlib import Path

from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from benchmarks.parity import cpu_config, load_model, prompt_dataset
from trl_thundersync.tiny.model import save_tiny_model
from trl_thundersync.trainers.grpo.config import ThunderSyncGRPOConfig
from trl_thundersync.trainers.grpo.trainer import ThunderSyncGRPOTrainer


def reward_digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) - len(c) / 16 for c in completions]


def one_run(model_path, tokenizer, out, schedule, args) -> list[dict]:
    config = cpu_config(ThunderSyncGRPOConfig, out, schedule=schedule, max_steps=args.steps, optim="sgd",
                        per_device_train_batch_size=args.batch, num_generations=args.group,
                        max_completion_length=args.max_len, rollout_engine=args.engine,
                        rollout_max_in_flight=args.in_flight, learning_rate=1e-3)
    trainer = ThunderSyncGRPOTrainer(model=load_model(model_path), reward_funcs=[reward_digits], args=config,
                                     train_dataset=prompt_dataset(64), processing_class=tokenizer)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    logs = [h for h in trainer.state.log_history if "thundersync/step_wall_seconds" in h]
    return logs[1:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-len", type=int, default=32)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--engine", default="local_process", choices=["local_process", "local_thread"])
    parser.add_argument("--out", default="outputs/schedules.json")
    args = parser.parse_args(argv)
    hf_logging.set_verbosity_error()
    work = Path(tempfile.mkdtemp(prefix="ts-schedules-"))
    model_path = str(save_tiny_model(work / "tiny"))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    steps: dict[str, list[dict]] = {"sync": [], "thundersync": []}
    for r in range(args.repeats):
        for schedule in ("sync", "thundersync"):
            steps[schedule] += one_run(model_path, tokenizer, work / f"{schedule}-{r}", schedule, args)

    def mean(schedule, key):
        return statistics.mean(s[f"thundersync/{key}"] for s in steps[schedule])

    summary = {}
    print(f"{'schedule':<12} {'step s':>8} {'±':>6} {'R s':>7} {'L s':>7} {'tail s':>7} {'idle':>6}")
    for schedule in steps:
        walls = [s["thundersync/step_wall_seconds"] for s in steps[schedule]]
        summary[schedule] = {
            "step_wall_mean": statistics.mean(walls), "step_wall_stdev": statistics.pstdev(walls),
            "rollout": mean(schedule, "rollout_seconds"), "learner_busy": mean(schedule, "learner_busy_seconds"),
            "tail": mean(schedule, "learner_tail_seconds"), "idle": mean(schedule, "learner_idle_fraction"),
            "steps": len(walls),
        }
        s = summary[schedule]
        print(f"{schedule:<12} {s['step_wall_mean']:>8.3f} {s['step_wall_stdev']:>6.3f} {s['rollout']:>7.3f} "
              f"{s['learner_busy']:>7.3f} {s['tail']:>7.3f} {s['idle']:>6.2f}")
    speedup = summary["sync"]["step_wall_mean"] / summary["thundersync"]["step_wall_mean"]
    print(f"speedup thundersync vs sync: {speedup:.2f}x  (engine={args.engine})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "summary": summary, "speedup": speedup}, indent=2))


if __name__ == "__main__":
    main()
