"""Print the FP32 exactness figures: ThunderSync vs stock `trl.GRPOTrainer` on identical batches, per option.

    python -m trl_thundersync.bench.exactness [--out outputs/exactness.json] [--reward-scopes]

For every case of `testing.parity.PARITY_CASES` both trainers take one step from the same tiny model on the same
scripted rollouts; the relative error ‖g_ts − g_trl‖ / ‖g_trl‖ of the batch direction is printed and saved.
`--reward-scopes` adds the reward_scope table: 3 SGD steps with call-dependent rewards, the relative error of the
parameter displacement ‖Δθ_ts − Δθ_trl‖ / ‖Δθ_trl‖ per scope, next to the floor (stock TRL against itself with each
group's members reversed / rotated).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer

from ..testing.parity import (PARITY_CASES, load_model, relative_error, reward_batch_relative_length,
                              reward_group_rank, reward_len, reward_parity, run_trainer)
from ..testing.tiny import save_tiny_model
from ..trainers.grpo_config import ThunderSyncGRPOConfig
from ..trainers.grpo_trainer import ThunderSyncGRPOTrainer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/exactness.json")
    parser.add_argument("--reward-scopes", action="store_true", help="also print the reward_scope table")
    args = parser.parse_args(argv)
    hf_logging.set_verbosity_error()
    work = Path(tempfile.mkdtemp(prefix="ts-exactness-"))
    model_path = str(save_tiny_model(work / "tiny"))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = []
    print(f"{'case':<28} {'relative error':>15}")
    for name, overrides in PARITY_CASES.items():
        rewards = (reward_len, reward_parity) if "reward_weights" in overrides else (reward_len,)
        kwargs = dict(overrides, max_steps=1, max_grad_norm=0.0, logging_steps=100)
        with contextlib.redirect_stdout(io.StringIO()):  # the trainers' own log lines
            ref = run_trainer(GRPOTrainer, GRPOConfig, work / name / "trl", tokenizer, model_path, rewards=rewards,
                              **kwargs)
            got = run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, work / name / "ts", tokenizer,
                              model_path, rewards=rewards, **kwargs)
        error = relative_error(got.directions[0], ref.directions[0])
        rows.append({"case": name, "overrides": overrides, "relative_error": error})
        print(f"{name:<28} {error:>15.2e}")
    worst = max(r["relative_error"] for r in rows)
    print(f"worst case: {worst:.2e} (target ≤ 1e-5)")
    report = {"cases": rows, "worst": worst}
    if args.reward_scopes:
        report["reward_scopes"] = reward_scope_table(work, tokenizer, model_path)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


# (name, reward, GRPOConfig overrides): 2 groups of 4, 3 SGD steps
SCOPE_CASES = (
    ("group_rank", reward_group_rank, dict(max_grad_norm=0.5)),
    ("batch_relative_length", reward_batch_relative_length, dict(max_grad_norm=0.5)),
    ("batch_relative_length, scale_rewards=batch, no clip", reward_batch_relative_length,
     dict(scale_rewards="batch", max_grad_norm=0.0)),
)


def reward_scope_table(work: Path, tokenizer, model_path: str) -> list[dict]:
    base = dict(max_steps=3, optim="sgd", learning_rate=1e-2, num_generations=4, per_device_train_batch_size=8,
                logging_steps=100)
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(model_path).parameters()])
    scopes = ("trajectory", "group", "batch")
    print(f"\n{'reward (3 SGD steps), rel. error of Δθ':<52} {'floor':>9}" + "".join(f" {s:>10}" for s in scopes))
    rows = []
    for name, reward, overrides in SCOPE_CASES:
        kw = dict(base, **overrides)
        out = work / "scopes" / name.split(",")[0]
        with contextlib.redirect_stdout(io.StringIO()):
            ref = run_trainer(GRPOTrainer, GRPOConfig, out / "trl", tokenizer, model_path, rewards=(reward,), **kw)
            delta = ref.params - initial
            floor = max(relative_error(run_trainer(GRPOTrainer, GRPOConfig, out / o, tokenizer, model_path,
                                                   rewards=(reward,), member_order=o, **kw).params - initial, delta)
                        for o in ("reverse", "rotate"))
            errors = {s: relative_error(run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, out / s, tokenizer,
                                                    model_path, rewards=(reward,), reward_scope=s, **kw).params
                                        - initial, delta) for s in scopes}
        rows.append({"reward": name, "overrides": overrides, "floor": floor, "relative_error": errors})
        print(f"{name:<52} {floor:>9.2e}" + "".join(f" {errors[s]:>10.2e}" for s in scopes))
    return rows


if __name__ == "__main__":
    main()
