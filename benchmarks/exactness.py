"""Print the FP32 exactness figures: ThunderSync vs stock `trl.GRPOTrainer` on identical batches, per option.

    python -m benchmarks.exactness [--out outputs/exactness.json] [--reward-scopes]

For every case of `benchmarks.parity.PARITY_CASES` both trainers take one step from the same tiny model on the same
scripted rollouts; the relative error ‖g_ts − g_trl‖ / ‖g_trl‖ of the batch direction is printed and saved.
`--reward-scopes` adds the reward_scope × release table: 3 SGD and 3 AdamW steps with call-dependent rewards, the
relative error of the parameter displacement ‖Δθ_ts − Δθ_trl‖ / ‖Δθ_trl‖ per scope, next to the floor (stock TRL
against itself with each group's members reversed / rotated).
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

from benchmarks.parity import (
    PARITY_CASES,
    load_model,
    relative_error,
    reward_batch_relative_length,
    reward_group_rank,
    reward_len,
    reward_parity,
    run_trainer,
)
from trl_thundersync.tiny.model import save_tiny_model
from trl_thundersync.trainers.grpo.config import ThunderSyncGRPOConfig
from trl_thundersync.trainers.grpo.trainer import ThunderSyncGRPOTrainer


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


RELEASES = ("reward", "content")  # "turn" needs agentic turns; without them it is "content"


def reward_scope_table(work: Path, tokenizer, model_path: str) -> list[dict]:
    """Every reward_scope × release point, 3 steps with SGD and with AdamW, against the permuted-member floor."""
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(model_path).parameters()])
    columns = [(s, r) for s in ("trajectory", "group", "batch") for r in RELEASES]
    print(f"\n{'reward (3 steps), rel. error of Δθ':<44} {'optim':<6} {'floor':>9}"
          + "".join(f" {s[:5] + '/' + r[:4]:>11}" for s, r in columns))
    rows = []
    for optim, lr in (("sgd", 1e-2), ("adamw_torch", 1e-4)):
        base = dict(max_steps=3, optim=optim, learning_rate=lr, num_generations=4, per_device_train_batch_size=8,
                    logging_steps=100)
        for name, reward, overrides in SCOPE_CASES:
            kw = dict(base, **overrides)
            out = work / "scopes" / optim / name.split(",")[0]
            with contextlib.redirect_stdout(io.StringIO()):
                ref = run_trainer(GRPOTrainer, GRPOConfig, out / "trl", tokenizer, model_path, rewards=(reward,), **kw)
                delta = ref.params - initial
                floor = max(relative_error(run_trainer(GRPOTrainer, GRPOConfig, out / o, tokenizer, model_path,
                                                       rewards=(reward,), member_order=o, **kw).params - initial,
                                           delta) for o in ("reverse", "rotate"))
                errors = {f"{s}/{r}": relative_error(run_trainer(
                    ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, out / f"{s}-{r}", tokenizer, model_path,
                    rewards=(reward,), reward_scope=s, release=r, **kw).params - initial, delta) for s, r in columns}
            rows.append({"reward": name, "optim": optim, "overrides": overrides, "floor": floor,
                         "relative_error": errors})
            print(f"{name[:44]:<44} {optim[:6]:<6} {floor:>9.2e}" + "".join(f" {errors[f'{s}/{r}']:>11.2e}"
                                                                          for s, r in columns))
    return rows


if __name__ == "__main__":
    main()
