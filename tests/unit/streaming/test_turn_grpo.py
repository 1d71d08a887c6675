"""Per-turn GRPO backward (content-ready release) equals the whole-trajectory `TrajectoryBackward`, which computes
log-probabilities with TRL's own `_get_per_token_logps_and_entropies` (fused LM head, temperature)."""

from __future__ import annotations

import math

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from benchmarks.turns import synthetic_trajectory
from tests.fixtures.turn_grpo import (
    EOS,
    TOLERANCE,
    _model,
    _rel,
    _rollout,
    _setup,
    _trajectories,
    _trl_logps,
    _with_sampler,
)
from trl_thundersync.errors import ConfigurationError, NonFiniteGradientError, StalePolicyError, TurnOrderError
from trl_thundersync.streaming.gradient_sinks import FlatGradient, GradientSum, all_finite
from trl_thundersync.streaming.importance import SamplingCorrection
from trl_thundersync.streaming.normalization import LossNormalization
from trl_thundersync.streaming.segment_backward import BoundaryCut, FullContext
from trl_thundersync.streaming.shared_prefix import PassWork, pass_flop_counter
from trl_thundersync.streaming.source import TrajectoryBackward
from trl_thundersync.streaming.turn_grpo import TurnScoreBackward
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer
from trl_thundersync.types import Rollout, ScoredRollout, TurnEvent


def _compare(whole, turns, events, rollout) -> float:
    for event in events:
        turns.turn(event)
    ours = turns.finish(rollout, 0)
    expected = whole(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0)
    assert ours is not None, turns.fallbacks
    assert ours.scored_tokens == expected.scored_tokens
    assert (ours.score_grad is None) == (expected.score_grad is None)
    assert (ours.free_grad is None) == (expected.free_grad is None)
    errors = [0.0]
    if expected.score_grad is not None:
        errors.append(_rel(ours.score_grad, expected.score_grad))
    if expected.free_grad is not None:
        errors.append(_rel(ours.free_grad, expected.free_grad))
        assert ours.free_value == pytest.approx(expected.free_value, rel=TOLERANCE, abs=1e-9)
        assert ours.kl_sum == pytest.approx(expected.kl_sum, rel=TOLERANCE, abs=1e-9)
    assert turns.held_bytes() == 0 and not turns.open and not turns.core.open
    return max(errors)


CASES = [  # (loss_type, beta, temperature, importance sampling mode or None, bias-corrected KL[, turn_backward])
    ("grpo", 0.0, 1.0, None, True),
    ("grpo", 0.2, 0.7, "token_mask", True, "naive"),
    ("dapo", 0.0, 0.7, None, True),
    ("grpo", 0.2, 0.7, None, True),
    ("dapo", 0.2, 1.3, None, False),
    ("grpo", 0.0, 0.7, "sequence_mask", True),
    ("dapo", 0.2, 1.0, "sequence_truncate", True),
    ("grpo", 0.2, 0.7, "token_mask", True),
    ("dapo", 0.0, 1.3, "token_truncate", True),
]


def _case_trajectories(policy, mode):
    """The three synthetic trajectories and their Rollouts (one with a trailing observation, one ending in EOS), with
    noisy sampler log-probs when an importance-sampling `mode` is set."""
    for n, events in enumerate(_trajectories(policy.config.vocab_size)):
        events, rollout = _rollout(events, trailing=(3, 4, 5) if n == 0 else (), eos_last=n == 2)
        if mode:
            events, rollout = _with_sampler(events, rollout, policy, scale=0.3 if mode.startswith("token") else
                                            0.05, seed=n)
        yield events, rollout


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_turns_equal_trajectory_backward(case):
    loss_type, beta, temperature, mode, bias, *core = case
    correction = SamplingCorrection(mode, 0.8, 1.25) if mode else None
    policy, whole, turns = _setup(loss_type, beta, temperature, correction, bias_correction_kl=bias,
                                  turn_backward=core[0] if core else "boundary_cut")
    worst = 0.0
    for events, rollout in _case_trajectories(policy, mode):
        worst = max(worst, _compare(whole, turns, events, rollout))
    assert worst <= TOLERANCE
    print(f"max relative error {worst:.2e}")


def test_sequence_mask_outside_the_clip_range_zeroes_the_score():
    policy, whole, turns = _setup("grpo", 0.0, 1.0, SamplingCorrection("sequence_mask", 0.8, 1.25))
    events, rollout = _rollout(_trajectories(policy.config.vocab_size)[0])
    events, rollout = _with_sampler(events, rollout, policy, scale=1.0, seed=5)
    for event in events:
        turns.turn(event)
    ours = turns.finish(rollout)
    assert ours is not None and float(ours.score_grad.abs().max()) == 0.0
    assert float(whole(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0).score_grad.abs().max()) == 0.0


@pytest.mark.parametrize("mask_truncated", [True, False])
@pytest.mark.parametrize("flag", [True, None])  # the agent loop's flag, or TRL's rule (last token not EOS)
def test_truncated_rollout(mask_truncated, flag):
    policy, whole, turns = _setup("grpo", 0.2, 1.0, None, mask_truncated=mask_truncated)
    events, rollout = _rollout(_trajectories(policy.config.vocab_size)[0], truncated=flag)
    if mask_truncated:
        for event in events:
            turns.turn(event)
        ours = turns.finish(rollout)
        assert ours.score_grad is None and ours.free_grad is None and ours.scored_tokens == 0
        assert whole(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0).scored_tokens == 0
        assert turns.held_bytes() == 0
    else:
        assert _compare(whole, turns, events, rollout) <= TOLERANCE


def _mismatches(vocab):
    events, rollout = _rollout(synthetic_trajectory(0, vocab, prompt=6, actions=[4, 5, 3], framings=[3, 2], seed=3))
    cut_last = Rollout(**{**rollout.__dict__, "completion_ids": rollout.completion_ids[:-2],
                          "env_mask": rollout.env_mask[:-2]})  # the loop cut the last action after its event
    wrong_mask = Rollout(**{**rollout.__dict__, "env_mask": (0,) + rollout.env_mask[1:]})  # an action token as env
    retokenized = list(events)
    e = retokenized[2]  # the observation before turn 2 came back re-tokenized (one id differs)
    retokenized[2] = TurnEvent(e.index, e.turn, 0, e.context_ids[:-1] + ((e.context_ids[-1] + 1) % vocab,),
                               e.action_ids, 0.0)
    return {"last action cut": (events, cut_last), "env mask": (events, wrong_mask),
            "re-tokenized observation": (retokenized, rollout), "missing turn": (events[:1] + events[2:], rollout),
            "token mode without sampler log-probs": (events, rollout)}


@pytest.mark.parametrize("case", ["last action cut", "env mask", "re-tokenized observation", "missing turn",
                                  "token mode without sampler log-probs"])
def test_mismatching_history_falls_back(case):
    correction = SamplingCorrection("token_truncate", None, 3.0) if case.startswith("token") else None
    policy, _, turns = _setup("grpo", 0.2, 1.0, correction)
    events, rollout = _mismatches(policy.config.vocab_size)[case]
    if correction is not None:
        rollout = Rollout(**{**rollout.__dict__, "sampling_logprobs": (-1.0,) * len(rollout.completion_ids)})
    for event in events:
        turns.turn(event)
    assert turns.finish(rollout) is None
    assert rollout.index in turns.fallbacks
    assert turns.held_bytes() == 0 and not turns.open and not turns.core.open and not turns.reference.open


def _two_channel_objective(logits, actions):
    logps = torch.log_softmax(logits, -1)
    return {"a": logps.gather(-1, actions[:, None]).sum(), "b": (logps.exp() * logps).sum() * 0.3}


def test_channels_equal_their_standalone_gradients():
    """Two channels through the boundary cut: each sink equals the full-context gradient of that channel alone."""
    model = _model(1, 1.0)
    params = [p for p in model.parameters() if p.requires_grad]
    results = {}
    for name, core_cls in (("cut", BoundaryCut), ("naive", FullContext)):
        for only in ("a", "b", None):
            sinks = {"a": FlatGradient(params), "b": FlatGradient(params)}
            core = core_cls(model, params)
            objective = _two_channel_objective if only is None else (
                lambda logits, actions, c=only: {c: _two_channel_objective(logits, actions)[c]})
            for events in _trajectories(model.config.vocab_size):
                for event in events:
                    core.turn(event, objective, sinks, f"trajectory {event.index} turn {event.turn}")
                core.close(events[0].index, sinks)
            results[name, only] = {c: s.vector for c, s in sinks.items()}
    for channel in ("a", "b"):
        standalone = results["naive", channel][channel]
        assert standalone.norm() > 0
        assert _rel(results["cut", None][channel], standalone) <= TOLERANCE
        assert _rel(results["naive", None][channel], standalone) <= TOLERANCE
        assert _rel(results["cut", channel][channel], standalone) <= TOLERANCE
    assert float(results["cut", "a"]["b"].abs().max()) == 0.0  # nothing leaks into the other channel


def test_replay_carries_each_channels_signal():
    """Without the close-time replay both channels are wrong (the deferred adjoints are per channel and real)."""
    policy, whole, turns = _setup("grpo", 0.2, 1.0, None)
    events, rollout = _rollout(_trajectories(policy.config.vocab_size)[0])
    for event in events:
        turns.turn(event)
    state = turns.open[0]
    partial_score, partial_free = state.score.vector.clone(), state.free.vector.clone()
    ours = turns.finish(rollout)
    weight = 1.0 / ours.scored_tokens
    assert _rel(partial_score * weight, ours.score_grad) > 1e-3
    assert _rel(partial_free * weight, ours.free_grad) > 1e-3


def test_cost_is_linear_in_turns():
    """Boundary cut forwards each token once (Σ forwarded = history length); the naive backward is quadratic."""
    model = _model(1, 1.0)
    params = [p for p in model.parameters() if p.requires_grad]
    n = 8
    events = synthetic_trajectory(0, model.config.vocab_size, prompt=6, actions=[3] * n, framings=[4] * (n - 1),
                                  seed=7)
    _, rollout = _rollout(events)
    norm = LossNormalization("dapo", 1, 1, 64)
    turns = TurnScoreBackward(model=model, params=params, normalization=norm, eos_and_pad=(EOS,),
                              mask_truncated=False)
    forwarded = [turns.turn(e) for e in events]
    length = len(rollout.prompt_ids) + len(rollout.completion_ids)
    assert sum(forwarded) == length
    naive = FullContext(model, params)
    sinks = {"score": FlatGradient(params)}
    naive_forwarded = sum(naive.turn(e, lambda logits, a: {"score": logits.sum()}, sinks, "").forwarded_tokens
                          for e in events)
    assert naive_forwarded == sum(len(e.context_ids) + len(e.action_ids) for e in events) > 3 * length
    replayed = turns.core.close(0, {"score": turns.open[0].score})
    assert replayed <= length


def test_memory_is_reported_and_freed():
    policy, _, turns = _setup("grpo", 0.2, 1.0, None)
    events, rollout = _rollout(_trajectories(policy.config.vocab_size)[0])
    params = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert turns.buffer_bytes == 2 * 4 * params
    held = []
    for event in events:
        turns.turn(event)
        held.append(turns.held_bytes(0))
    assert held[0] > turns.buffer_bytes and held == sorted(held)  # graphs and adjoints grow with the turns
    assert turns.reference.held_bytes(0) > 0
    turns.finish(rollout)
    assert turns.held_bytes() == 0


def test_non_finite_turn_raises_and_names_it():
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=2, seed=4)
    params = [p for p in model.parameters() if p.requires_grad]
    turns = TurnScoreBackward(model=model, params=params, normalization=LossNormalization("dapo", 1, 1, 64),
                              eos_and_pad=(EOS,), mask_truncated=False)
    events = _trajectories(model.config.vocab_size)[0]
    turns.turn(events[0])
    with torch.no_grad():
        model.lm_head.weight[0, 0] = math.inf
    with pytest.raises(NonFiniteGradientError, match="trajectory 0 turn 1"):
        turns.turn(events[1])
    assert not turns.open and turns.held_bytes() == 0


def test_stale_turn_is_refused():
    policy, _, turns = _setup("dapo", 0.0, 1.0, None)
    event = _trajectories(policy.config.vocab_size)[0][0]
    with pytest.raises(StalePolicyError, match="trajectory 0 turn 0"):
        turns.turn(TurnEvent(event.index, event.turn, 3, event.context_ids, event.action_ids, 0.0))


def test_activation_checkpointing_needs_the_naive_turn_backward():
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=2, seed=5)
    add_fused_lm_head(model)
    model.train()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in model.parameters() if p.requires_grad]
    common = dict(params=params, normalization=LossNormalization("grpo", 1, 1, 64), eos_and_pad=(EOS,),
                  mask_truncated=False)
    with pytest.raises(ConfigurationError, match="gradient_checkpointing"):
        TurnScoreBackward(model=model, **common)
    turns = TurnScoreBackward(model=model, turn_backward="naive", **common)
    whole = TrajectoryBackward(logps_fn=_trl_logps(model), **common)
    events, rollout = _rollout(_trajectories(model.config.vocab_size)[1])
    assert _compare(whole, turns, events, rollout) <= TOLERANCE


def test_a_trajectory_without_turn_events_falls_back_unless_it_scores_nothing():
    policy, _, turns = _setup("dapo", 0.0, 1.0, None, mask_truncated=True)
    _, rollout = _rollout(_trajectories(policy.config.vocab_size)[0], truncated=False)
    assert turns.finish(rollout) is None and "no turn" in turns.fallbacks[0]
    masked = Rollout(**{**rollout.__dict__, "index": 1, "truncated": True})
    assert turns.finish(masked) == TrajectoryBackward(
        params=turns.params, logps_fn=None, normalization=turns.normalization, eos_and_pad=(EOS,),
        mask_truncated=True)(ScoredRollout(masked, (1.0,), 1.0, 0.0), 0)


# -- coalesced turns: consecutive ready turns of one trajectory learned as one segment (`coalesce.py`) -------------
def _coalesced_compare(whole, turns, events, rollout, runs) -> float:
    """`_compare` with the turns submitted in `runs` (lengths of consecutive runs, e.g. (1, 3): turn 0, then 1..3)."""
    position = 0
    for size in runs:
        part = events[position : position + size]
        if part:
            turns.turns(part) if len(part) > 1 else turns.turn(part[0])
        position += size
    assert position >= len(events)
    return _compare(whole, turns, [], rollout)


@pytest.mark.parametrize("runs", [(1, 3), (2, 2), (4,), (3, 1)], ids=lambda r: "+".join(map(str, r)))
@pytest.mark.parametrize("case", CASES[2:], ids=lambda c: "-".join(map(str, c)))
def test_coalesced_turns_equal_trajectory_backward(case, runs):
    loss_type, beta, temperature, mode, bias, *core = case
    correction = SamplingCorrection(mode, 0.8, 1.25) if mode else None
    policy, whole, turns = _setup(loss_type, beta, temperature, correction, bias_correction_kl=bias)
    worst = 0.0
    for events, rollout in _case_trajectories(policy, mode):
        worst = max(worst, _coalesced_compare(whole, turns, events, rollout, runs))
    assert worst <= TOLERANCE


def test_coalesced_turns_forward_each_token_once_and_replay_less():
    """One segment for turns 1..n−1: the same tokens forwarded, fewer segments for the close to replay."""
    model = _model(1, 1.0)
    params = [p for p in model.parameters() if p.requires_grad]
    events = synthetic_trajectory(0, model.config.vocab_size, prompt=6, actions=[3] * 4, framings=[4] * 3, seed=7)
    norm = LossNormalization("dapo", 1, 1, 64)
    replayed, forwarded = {}, {}
    for coalesce in (False, True):
        turns = TurnScoreBackward(model=model, params=params, normalization=norm, eos_and_pad=(EOS,),
                                  mask_truncated=False)
        forwarded[coalesce] = (turns.turn(events[0]) + turns.turns(events[1:]) if coalesce
                               else sum(turns.turn(e) for e in events))
        assert len(turns.core.open[0].segments) == (2 if coalesce else 4)
        replayed[coalesce] = turns.core.close(0, {"score": turns.open[0].score})
    assert forwarded[True] == forwarded[False]
    assert replayed[True] < replayed[False]


def test_coalesced_turns_refuse_a_history_that_does_not_extend():
    policy, _, turns = _setup("grpo", 0.0, 1.0, None)
    events = _trajectories(policy.config.vocab_size)[0]
    at = len(events[1].context_ids)  # turn 2 says turn 1's first action token was another one
    context = events[2].context_ids
    bad = TurnEvent(0, 2, 0, context[:at] + ((context[at] + 1) % 100,) + context[at + 1 :], events[2].action_ids, 0.0)
    assert turns.turns([events[0], events[1], bad]) == 0
    assert "does not extend" in turns.fallbacks[0] and not turns.open
    params = list(policy.parameters())
    with pytest.raises(TurnOrderError, match="coalesced turns must extend"):
        BoundaryCut(policy, params).turns([events[0], events[1], bad], lambda logits, a: {"score": logits.sum()},
                                          {"score": FlatGradient(params)}, "")


def test_gradient_sinks_refuse_non_finite_entries_only():
    """One reduction per tensor finds a NaN or inf entry; finite entries whose sum overflows FP32 are accepted."""
    params = [torch.zeros(3), torch.zeros(2, 2)]
    big = torch.full((2, 2), 3e38)  # finite, but its FP32 sum is inf
    for sink in (FlatGradient(params), GradientSum(params)):
        sink.add([torch.ones(3), big], "ok")
        for bad in (float("nan"), float("inf")):
            with pytest.raises(NonFiniteGradientError, match="trajectory 9 turn 1"):
                sink.add([torch.tensor([1.0, bad, 0.0]), None], "trajectory 9 turn 1")
    assert float(FlatGradient(params).vector.sum()) == 0.0


def test_all_finite_sees_every_non_finite_entry_and_accepts_an_overflowing_sum():
    vector = torch.zeros(1000)
    assert all_finite(vector)
    for bad in (float("nan"), float("inf"), -float("inf")):
        vector[517] = bad
        assert not all_finite(vector)
    assert all_finite(torch.full((4,), 3e38))  # finite entries, an FP32 sum of inf
    assert not all_finite(torch.tensor([float("inf"), -float("inf"), 1.0]))  # (their sum is NaN)


def test_turn_passes_are_priced_as_they_ran():
    """Each turn's forward over its history and its backward per channel, then the close's backward-only replay of
    every segment but the last, in the ledger's accounting (`pass_flops`); coalesced turns run fewer passes."""
    model = _model(1, 1.0)
    params = [p for p in model.parameters() if p.requires_grad]
    counter = pass_flop_counter(model, params)
    events = synthetic_trajectory(0, model.config.vocab_size, prompt=6, actions=[3, 4, 5], framings=[2, 2], seed=3)
    _, rollout = _rollout(events)
    norm = LossNormalization("dapo", 1, 1, 64)
    priced = {}
    for coalesce in (False, True):
        turns = TurnScoreBackward(model=model, params=params, normalization=norm, eos_and_pad=(EOS,),
                                  mask_truncated=False, flops=counter)
        calls = [events] if coalesce else [[e] for e in events]
        per_call = []
        for call in calls:
            turns.turns(call)
            per_call.append(turns.last_flops)
        assert turns.finish(rollout) is not None
        priced[coalesce] = (per_call, turns.last_flops)
    lengths = [6 + 3, 2 + 4, 2 + 5]  # the segments: prompt + action 0, framing + action 1, framing + action 2
    starts = [0, 9, 15]
    expected = [counter(PassWork(n, c, 1)) for n, c in zip(lengths, starts, strict=True)]
    replay = sum(counter(PassWork(n, c, 1)) - counter(PassWork(n, c, 0))
                 for n, c in zip(lengths[:2], starts[:2], strict=True))
    assert priced[False][0] == pytest.approx(expected) and priced[False][1] == pytest.approx(replay)
    assert priced[True][0] == pytest.approx([counter(PassWork(sum(lengths), 0, 1))]) and priced[True][1] == 0
