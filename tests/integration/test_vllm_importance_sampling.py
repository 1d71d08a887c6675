"""TRL's vLLM importance-sampling correction, streamed: the batch direction matches stock `trl.GRPOTrainer` with
`use_vllm=True` on the same trajectories and the same sampler log-probs.

vLLM cannot run here, so the reference trainer's vLLM backend is replaced by a stand-in that never generates (the
trajectories come from `rollout_func`, exactly as for TRL users who generate themselves); every other line of TRL's
correction (old log-probs, ratio, truncation or masking, multiplication of the policy loss) is TRL's own.
The sampler's log-probs are the policy's own plus a per-trajectory offset, so sequence ratios spread over
[0.3, 4.5]: some are truncated or masked at the default clip_max=3.
"""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import (
    CaptureGrads,
    cpu_config,
    load_model,
    prompt_dataset,
    relative_error,
    reward_len,
)
from tests.fixtures.sampler_logprobs import CASES, _NoVLLM, rollout_with_sampler_logprobs
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.errors import UnsupportedOptionError
from trl_thundersync.streaming.importance import SamplingCorrection

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_correction_matches_trl(case, tmp_path, tokenizer, tiny_model_path, monkeypatch):
    import trl.trainer.grpo_trainer as trl_grpo

    monkeypatch.setattr(trl_grpo, "VLLMGeneration", _NoVLLM)
    overrides = dict(CASES[case], max_steps=1, max_grad_norm=0.0)
    directions = {}
    for name, trainer_cls, config_cls in (("trl", GRPOTrainer, GRPOConfig),
                                          ("thundersync", ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig)):
        vllm = dict(use_vllm=True, vllm_mode="server") if name == "trl" else {}
        capture = CaptureGrads()
        trainer = trainer_cls(model=load_model(tiny_model_path), reward_funcs=[reward_len],
                              args=cpu_config(config_cls, tmp_path / name, **vllm, **overrides),
                              train_dataset=prompt_dataset(), processing_class=tokenizer,
                              rollout_func=rollout_with_sampler_logprobs(tokenizer), callbacks=[capture])
        if name == "thundersync":
            # ThunderSync refuses rollout_func with use_vllm=True (it would not generate on the servers); switch the
            # correction on after construction so that the very same scripted trajectories reach its learner.
            trainer.args.use_vllm = True
        trainer.train()
        directions[name] = capture.directions[0]
    assert directions["trl"].norm() > 0
    assert relative_error(directions["thundersync"], directions["trl"]) <= 1e-5


def test_the_correction_changes_the_direction(tmp_path, tokenizer, tiny_model_path):
    """Guard against a vacuous parity: with the correction off, the same run gives another direction."""
    runs = {}
    for use_vllm in (False, True):
        capture = CaptureGrads()
        trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len],
                                         args=cpu_config(ThunderSyncGRPOConfig, tmp_path / str(use_vllm),
                                                         max_steps=1, max_grad_norm=0.0),
                                         train_dataset=prompt_dataset(), processing_class=tokenizer,
                                         rollout_func=rollout_with_sampler_logprobs(tokenizer), callbacks=[capture])
        trainer.args.use_vllm = use_vllm
        trainer.train()
        runs[use_vllm] = capture.directions[0]
    assert relative_error(runs[True], runs[False]) > 1e-2


def test_weights_follow_trl_modes():
    logps = torch.tensor([[-1.0, -2.0, -0.5]])
    sampling = torch.tensor([[-1.5, -1.0, float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # d = [0.5, -1.0, 0 (masked, NaN → 0)]
    seq = SamplingCorrection("sequence_mask", None, 3.0).weights(logps, sampling, mask)
    assert seq.shape == (1, 1) and torch.allclose(seq, torch.exp(torch.tensor([[-0.5]])))
    tok = SamplingCorrection("token_truncate", 0.5, 1.5).weights(logps, sampling, mask)
    assert torch.allclose(tok, torch.tensor([[1.5, 0.5, 1.0]]))
    masked = SamplingCorrection("token_mask", 0.5, 1.5).weights(logps, sampling, mask)
    assert torch.allclose(masked, torch.tensor([[0.0, 0.0, 1.0]]))


def test_vespo_with_the_correction_is_refused(tmp_path):
    with pytest.raises(UnsupportedOptionError, match="vespo"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, use_vllm=True, vllm_mode="server", loss_type="vespo")
