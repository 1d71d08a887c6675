"""V_i, the per-trajectory coefficient of the loss value TRL reports (`source.policy_value`): TRL's per-token policy
loss at ratio 1 is −A·g·c_t·h_t (h = log π for cispo / vespo, else 1; g = min(1, ε_high) for cispo; c the vLLM IS
weight), so V_i = Σ_t m_t u_i g c_t h_t. The per-turn backward (`turn_grpo.py`) must report the whole trajectory's.
Against stock TRL's logged loss: tests/integration/test_loss_value_vs_trl.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.fixtures.turn_grpo import EOS, _rollout, _setup, _trajectories, _trl_logps, _with_sampler
from trl_thundersync.streaming.importance import SamplingCorrection
from trl_thundersync.streaming.source import loss_mask
from trl_thundersync.types import ScoredRollout

CASES = [(loss, mode) for loss in ("grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
         for mode in (None, "token_truncate", "sequence_mask") if loss != "vespo" or mode is None]


@pytest.mark.parametrize("loss_type, mode", CASES)
def test_per_turn_value_equals_the_whole_trajectory_and_trl_formula(loss_type, mode):
    correction = SamplingCorrection(mode, 0.8, 1.25) if mode else None
    policy, whole, turns = _setup(loss_type, 0.0, 0.7, correction)
    coefficient = 0.5 if loss_type == "cispo" else 1.0  # cispo with epsilon_high = 0.5
    whole.normalization = turns.normalization = replace(whole.normalization, policy_coefficient=coefficient)
    for n, events in enumerate(_trajectories(policy.config.vocab_size)):
        events, rollout = _rollout(events, trailing=(3, 4, 5) if n == 0 else (), eos_last=n == 2)
        if mode:
            events, rollout = _with_sampler(events, rollout, policy, scale=0.3 if mode.startswith("token") else 0.05,
                                            seed=n)
        for event in events:
            turns.turn(event)
        ours = turns.finish(rollout, 0)
        expected = whole(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0)
        assert ours is not None, turns.fallbacks
        assert ours.policy_value == pytest.approx(expected.policy_value, rel=1e-5, abs=1e-9)

        ids = torch.tensor([list(rollout.prompt_ids) + list(rollout.completion_ids)])
        with torch.no_grad():
            logps = _trl_logps(policy)(ids, torch.ones_like(ids), len(rollout.completion_ids))
        mask = loss_mask(rollout, (EOS,), False).unsqueeze(0)
        c = correction.weights(logps, torch.tensor([rollout.sampling_logprobs]), mask) if mode else 1.0
        h = logps if loss_type in ("cispo", "vespo") else torch.ones_like(logps)
        u = 1.0 / mask.sum() if loss_type in ("grpo", "sapo") else 1.0
        want = float((coefficient * h * c * mask).sum() * u)
        assert expected.policy_value == pytest.approx(want, rel=1e-5, abs=1e-9)
        if loss_type in ("cispo", "vespo") and mode is None:
            assert expected.policy_value < 0  # Σ log π: the value −A·V has the sign of A, unlike −A·Σ_t m u
