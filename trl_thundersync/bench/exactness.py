"""Print the FP32 exactness figures: ThunderSync vs stock `trl.GRPOTrainer` on identical batches, per option.

    python -m trl_thundersync.bench.exactness [--out outputs/exactness.json]

For every case of `testing.parity.PARITY_CASES` both trainers take one step from the same tiny model on the same
scripted rollouts; the relative error ‖g_ts − g_trl‖ / ‖g_trl‖ of the batch direction is printed and saved.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path

from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer

from ..testing.parity import PARITY_CASES, relative_error, reward_len, reward_parity, run_trainer
from ..testing.tiny import save_tiny_model
from ..trainers.grpo_config import ThunderSyncGRPOConfig
from ..trainers.grpo_trainer import ThunderSyncGRPOTrainer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/exactness.json")
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
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cases": rows, "worst": worst}, indent=2))


if __name__ == "__main__":
    main()
