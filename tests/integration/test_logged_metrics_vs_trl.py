"""One process: every metric ThunderSync logs from its streamed pass is what stock TRL logs on the same scripted
batches (`trainers/grpo/metrics.py`) — the clip ratios at ratio 1 (cispo's the positive-advantage share when
ε_high < 1), `kl` per micro-batch, lengths with masked truncations, rewards with None rows."""

from __future__ import annotations

import pytest
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import reward_len, reward_parity, run_trainer
from tests.fixtures.logged_metrics import same, timed
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

CASES = {
    # sequence-level ratio: TRL's masked means count rows; ε_high < 1: cispo "clips" every positive-advantage row
    "cispo_sequence_ga2": dict(loss_type="cispo", epsilon_high=0.5, importance_sampling_level="sequence",
                               gradient_accumulation_steps=2, per_device_train_batch_size=2),
    "cispo_ga2_beta": dict(loss_type="cispo", epsilon_high=0.5, beta=0.1, gradient_accumulation_steps=2,
                           per_device_train_batch_size=2),
    # rows masked to zero loss tokens, token-level clip ratios per micro-batch
    "grpo_mask_truncated_ga2": dict(loss_type="grpo", mask_truncated_completions=True, beta=0.1,
                                    gradient_accumulation_steps=2, per_device_train_batch_size=2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logged_metrics_equal_stock_trl(case, tmp_path, tokenizer, tiny_model_path):
    histories = {}
    for name, trainer_cls, config_cls in (("trl", GRPOTrainer, GRPOConfig),
                                          ("ts", ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig)):
        run = run_trainer(trainer_cls, config_cls, tmp_path / name, tokenizer, tiny_model_path,
                          rewards=(reward_len, reward_parity), max_steps=2, **CASES[case])
        histories[name] = run.trainer.state.log_history
    expected = {"cispo_clip_ratio" if case.startswith("cispo") else "clip_ratio/low_min"}
    expected |= {"kl"} if "beta" in CASES[case] else set()
    for step, (theirs, ours) in enumerate(zip(histories["trl"], histories["ts"], strict=True)):
        if step < 2:
            assert expected <= ours.keys(), step
            assert theirs.keys() - ours.keys() == {"entropy"}, step
        for key in (theirs.keys() & ours.keys()):
            if not timed(key):
                tolerance = 1e-6 if key == "kl" else 1e-7  # kl ~0.01 from log-prob differences (`same`)
                assert same(ours[key], theirs[key], tolerance), (step, key, ours[key], theirs[key])
    cispo = [h["cispo_clip_ratio"] for h in histories["trl"][:2] if "cispo_clip_ratio" in h]
    assert not cispo or max(cispo) > 0  # the case exercises a non-zero ratio
