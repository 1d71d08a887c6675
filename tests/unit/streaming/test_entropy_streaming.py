"""TRL's entropy bonus in the streamed pieces: the per-trajectory E_i (whole trajectory and per turn), its routing into
per-TRL-micro-batch buffers by the learner, and the barrier normalizer 1/(max(N_b, 1)·GA)."""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from tests.fixtures.turn_grpo import EOS, TOLERANCE, _rel, _rollout, _trajectories
from trl_thundersync.streaming.learner import GRPOBatchLearner, SourceGradients
from trl_thundersync.streaming.normalization import LossNormalization, entropy_scales
from trl_thundersync.streaming.source import TrajectoryBackward
from trl_thundersync.streaming.turn_grpo import TurnScoreBackward
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer
from trl_thundersync.types import Rollout, ScoredRollout


@functools.cache
def _model(seed: int, temperature: float):
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=2, seed=seed)
    add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))  # as GRPOTrainer's policy
    model.train()
    return model


def _trl_forward(model, compute_entropy):
    fn = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__
    owner = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext))
    if compute_entropy:
        return lambda ids, mask, keep: fn(owner, model, ids, mask, keep, compute_entropy=True)[:2]
    return lambda ids, mask, keep: fn(owner, model, ids, mask, keep)[0]


def _backwards(coef, temperature, turn_backward="boundary_cut", loss_type="grpo"):
    policy = _model(1, temperature)
    params = [p for p in policy.parameters() if p.requires_grad]
    norm = LossNormalization(loss_type, batch_size=4, micro_batches=1, max_completion_length=64)
    common = dict(params=params, normalization=norm, eos_and_pad=(EOS,), mask_truncated=False)
    whole = TrajectoryBackward(logps_fn=_trl_forward(policy, False), logps_entropy_fn=_trl_forward(policy, True),
                               entropy_coef=coef, **common)
    turns = TurnScoreBackward(model=policy, temperature=temperature, policy_version=0, turn_backward=turn_backward,
                              entropy_coef=coef, **common)
    return policy, whole, turns


def test_entropy_gradient_is_minus_coef_times_the_masked_entropy_sum():
    policy, whole, _ = _backwards(0.3, 0.7)
    events, rollout = _rollout(_trajectories(policy.config.vocab_size)[0], trailing=(3, 4, 5))
    got = whole(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0)
    ids = torch.tensor([list(rollout.prompt_ids) + list(rollout.completion_ids)])
    mask = torch.tensor([rollout.env_mask], dtype=torch.float32)
    _, entropies = _trl_forward(policy, True)(ids, torch.ones_like(ids), len(rollout.completion_ids))
    total = (entropies * mask).sum()
    params = [p for p in policy.parameters() if p.requires_grad]
    expected = torch.cat([g.reshape(-1) for g in torch.autograd.grad(-0.3 * total, params)])
    assert got.entropy_sum == pytest.approx(float(total), rel=1e-6)
    assert _rel(got.entropy_grad, expected) <= TOLERANCE
    assert got.score_grad is not None and got.free_grad is None  # the policy term is unchanged, no KL


@pytest.mark.parametrize("turn_backward, temperature", [("boundary_cut", 0.7), ("boundary_cut", 1.3),
                                                        ("naive", 1.0)])
def test_per_turn_entropy_channel_equals_the_whole_trajectory_term(turn_backward, temperature):
    policy, whole, turns = _backwards(0.5, temperature, turn_backward)
    worst = 0.0
    for n, events in enumerate(_trajectories(policy.config.vocab_size)):
        events, rollout = _rollout(events, trailing=(3, 4, 5) if n == 0 else (), eos_last=n == 2)
        for event in events:
            turns.turn(event)
        ours = turns.finish(rollout, 0)
        expected = whole(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0)
        assert ours is not None, turns.fallbacks
        assert ours.entropy_sum == pytest.approx(expected.entropy_sum, rel=1e-5)
        worst = max(worst, _rel(ours.entropy_grad, expected.entropy_grad), _rel(ours.score_grad, expected.score_grad))
        assert turns.held_bytes() == 0
    assert worst <= TOLERANCE


def test_a_zero_coefficient_keeps_the_entropy_value_and_no_gradient():
    """Adaptive entropy gated off (applied coefficient 0): the controller still needs Σ m H, the direction nothing."""
    policy, whole, turns = _backwards(0.0, 1.0)
    events, rollout = _rollout(_trajectories(policy.config.vocab_size)[0])
    expected = whole(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0)
    for event in events:
        turns.turn(event)
    ours = turns.finish(rollout, 0)
    assert expected.entropy_grad is None and ours.entropy_grad is None
    assert expected.entropy_sum > 0 and ours.entropy_sum == pytest.approx(expected.entropy_sum, rel=1e-5)
    # an unscorable row still pays its bonus: TRL's entropy term does not depend on the advantage
    unscorable = whole(ScoredRollout(rollout, (float("nan"),), float("nan"), 0.0), 0)
    assert unscorable.score_grad is None and unscorable.entropy_sum == pytest.approx(expected.entropy_sum)


def test_entropy_scales_are_per_micro_batch_token_means():
    assert entropy_scales({0: 4, 1: 6}, 2) == {0: 1 / 8, 1: 1 / 12}
    assert entropy_scales({0: 0, 1: 5}, 2) == {0: 1 / 2, 1: 1 / 10}  # clamp(min=1) as in TRL
    assert entropy_scales({0: 10}, 1) == {0: 0.1}


def _rollout_at(index):
    return Rollout(index=index, group=index // 2, policy_version=0, prompt_ids=(1,), completion_ids=(2, 3))


@pytest.mark.parametrize("release", ["reward", "content"])
def test_learner_adds_each_entropy_gradient_once_into_its_micro_batch(release):
    def backward(index):
        vec = torch.zeros(4)
        vec[index] = 1.0
        return SourceGradients(vec, vec * 10, 2, entropy_grad=vec * 100, entropy_sum=float(index))

    learner = GRPOBatchLearner(batch_size=4, num_generations=2, num_params=4, policy_version=0,
                               scale_rewards="group", source_backward=lambda s, b: backward(s.rollout.index),
                               release=release, content_backward=lambda r, b: backward(r.index),
                               entropy_micro_batch_of={0: 1, 1: 0, 2: 1, 3: 0}.__getitem__)
    for i in range(4):
        learner.submit_content(_rollout_at(i))
        if release == "content":  # a buffered trajectory keeps only H_i: K_i and E_i are folded already
            held = learner.buffered[i].grads
            assert held.free_grad is None and held.entropy_grad is None and held.score_grad is not None
    for i in range(4):
        learner.submit(ScoredRollout(_rollout_at(i), (float(i),), float(i), 0.0))
    totals = learner.finish()
    assert torch.equal(totals.entropy_terms[0], torch.tensor([0.0, 100.0, 0.0, 100.0]))
    assert torch.equal(totals.entropy_terms[1], torch.tensor([100.0, 0.0, 100.0, 0.0]))
    assert totals.entropy_sums == (0.0, 1.0, 2.0, 3.0)


def test_learner_without_the_bonus_reports_no_entropy_terms():
    learner = GRPOBatchLearner(batch_size=2, num_generations=2, num_params=4, policy_version=0,
                               scale_rewards="group",
                               source_backward=lambda s, b: SourceGradients(torch.ones(4), None, 2))
    for i in range(2):
        learner.submit(ScoredRollout(_rollout_at(i), (float(i),), float(i), 0.0))
    assert learner.finish().entropy_terms is None
