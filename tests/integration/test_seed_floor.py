"""The AdamW gap to the permuted-member floor is the backward's seed, nothing else (`benchmarks/seed_floor.py`).

Stock TRL back-propagates each row from −A_i·ν_i; ThunderSync from u_i, before A_i exists. Seeded with TRL's own
per-token seeds, ThunderSync's pipeline (folds, barrier, write into `param.grad`, TRL's clipping and AdamW) is back
at the permuted floor; stock TRL itself, rescaled (loss × c, gradients ÷ c), is as far from TRL as ThunderSync is.
"""

from __future__ import annotations

import pytest

from benchmarks.parity import reward_len
from benchmarks.seed_floor import displacement_errors
from tests.fixtures.floors import FP32_SPACING

pytestmark = [pytest.mark.slow, pytest.mark.exactness]  # the exactness layer (scripts/kernel_passes.sh)


def test_adamw_gap_to_permuted_floor_is_the_backward_seed(tmp_path, tokenizer, tiny_model_path):
    e = displacement_errors(tmp_path, tokenizer, tiny_model_path, reward_len, "trajectory", max_steps=3,
                            optim="adamw_torch", learning_rate=1e-4, num_generations=4, per_device_train_batch_size=8,
                            logging_steps=100, max_grad_norm=0.5)
    # figures for docs/rewards.md (`-rP`): on this CPU, how far TRL with another seed scale lands from the permuted
    # floor (its per-token rounding; no assertion that it must differ: on another CPU it may round alike)
    print({name: f"{value:.2e}" for name, value in e.items()})
    assert e["floor/perm"] < 1e-5 and e["floor/seed"] < 1e-4, e
    # the pipeline after the backward adds nothing: with TRL's seeds it is within twice the permuted floor
    assert e["ts/trl-seeds"] <= 2 * max(e["floor/perm"], FP32_SPACING), e
    # and ThunderSync (seed u_i, both release points) is within twice the floor that allows another seed
    floor = max(e["floor/perm"], e["floor/seed"], FP32_SPACING)
    assert e["ts/reward"] <= 2 * floor and e["ts/content"] <= 2 * floor, e
