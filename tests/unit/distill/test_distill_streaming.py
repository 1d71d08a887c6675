"""Streamed per-turn distillation equals the batch-synchronous reference, whatever the turn arrival order."""

from __future__ import annotations

import pytest
import torch

from benchmarks.turns import ReplayTurnEngine, SeededTeacher, synthetic_trajectory
from trl_thundersync.distill.learner import DistillBatchLearner, batch_direction
from trl_thundersync.distill.losses import generalized_jsd_per_token, opd_loss_sum
from trl_thundersync.distill.pipeline import TurnRouter, run_distill_batch
from trl_thundersync.distill.records import TeacherScores
from trl_thundersync.distill.turn_backward import BoundaryCutBackward, GradientSum, NaiveTurnBackward
from trl_thundersync.errors import NoScoredTokensError, StalePolicyError, TeacherScoringError
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer
from trl_thundersync.types import RolloutRequest

BETA = 0.4


@pytest.fixture(scope="module")
def student():
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=2, seed=2)
    model.train()
    return model


def _trajectories(vocab):
    shapes = [([4, 3, 5], [2, 3]), ([6], []), ([3, 0, 4], [2, 1]), ([2, 5], [0])]
    return [synthetic_trajectory(i, vocab, prompt=5 + i, actions=a, framings=f, seed=10 + i)
            for i, (a, f) in enumerate(shapes)]


def _objective(kind):
    if kind == "opd":
        return lambda logits, actions, teacher: opd_loss_sum(logits, actions, teacher.logprobs)
    return lambda logits, actions, teacher: generalized_jsd_per_token(logits, teacher.logits, BETA).sum()


def _reference(model, trajectories, teacher, kind):
    """Batch-synchronous: one full forward per finished trajectory, all action tokens, one token mean."""
    params = [p for p in model.parameters() if p.requires_grad]
    total, tokens = 0.0, 0
    for events in trajectories:
        last = events[-1]
        ids = torch.tensor([list(last.context_ids + last.action_ids)])
        logits = model(input_ids=ids, use_cache=False).logits[0]
        for e in events:
            if not e.action_ids:
                continue
            rows = logits[len(e.context_ids) - 1 : len(e.context_ids) - 1 + len(e.action_ids)]
            total = total + _objective(kind)(rows, torch.tensor(e.action_ids), teacher.score(e.context_ids,
                                                                                                e.action_ids))
            tokens += len(e.action_ids)
    grads = torch.autograd.grad(total / tokens, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                      for g, p in zip(grads, params, strict=True)])


def _streamed(model, trajectories, teacher, kind, *, order_seed, schedule="thundersync", cut=True, version=0,
              max_open=None, backward_spy=None):
    params = [p for p in model.parameters() if p.requires_grad]
    grads = GradientSum(params)
    backward = (BoundaryCutBackward if cut else NaiveTurnBackward)(model, params, _objective(kind), grads)
    if backward_spy is not None:
        backward = backward_spy(backward)
    learner = DistillBatchLearner(batch_size=len(trajectories), policy_version=0, backward=backward, grads=grads,
                                  max_open_trajectories=max_open)
    router = TurnRouter()
    engine = ReplayTurnEngine(trajectories, router, order_seed=order_seed)
    requests = [RolloutRequest(i, i, (), 0) for i in range(len(trajectories))]
    totals, timing = run_distill_batch(engine, requests, version, teacher, learner, schedule=schedule, router=router,
                                       logits_vocab_size=model.config.vocab_size if kind == "gjsd" else None)
    direction = batch_direction(totals.grads, totals.scored_tokens)
    return torch.cat([d.reshape(-1) for d in direction]), totals, timing


@pytest.mark.parametrize("kind", ["opd", "gjsd"])
def test_streamed_equals_batch_synchronous_for_random_orders(student, kind):
    vocab = student.config.vocab_size
    trajectories = _trajectories(vocab)
    teacher = SeededTeacher(vocab)
    reference = _reference(student, trajectories, teacher, kind)
    for order_seed in range(3):
        streamed, totals, timing = _streamed(student, trajectories, teacher, kind, order_seed=order_seed)
        rel = float((streamed - reference).norm() / reference.norm())
        assert rel <= 1e-5, (order_seed, rel)
        assert totals.scored_tokens == sum(len(e.action_ids) for t in trajectories for e in t)
        assert totals.turns == sum(len(t) for t in trajectories)
        assert {w.kind for w in totals.work} == {"turn_backward", "context_replay"}
        assert timing.teacher_seconds >= 0.0 and timing.teacher_wait >= 0.0


class _OpenStateSpy:
    """Wraps a `BoundaryCutBackward`: records how many trajectories hold boundary-cut state after each turn."""

    def __init__(self, backward) -> None:
        self.backward, self.sizes = backward, []

    def turn(self, event, teacher):
        outcome = self.backward.turn(event, teacher)
        self.sizes.append(len(self.backward.open))
        return outcome

    def close(self, index):
        return self.backward.close(index)


@pytest.mark.parametrize("cap", [1, 2])
def test_admission_cap_bounds_retained_state_and_keeps_the_direction(student, cap):
    vocab = student.config.vocab_size
    trajectories = _trajectories(vocab)
    teacher = SeededTeacher(vocab)
    reference = _reference(student, trajectories, teacher, "gjsd")
    for order_seed in range(3):
        spies = []
        streamed, totals, _ = _streamed(student, trajectories, teacher, "gjsd", order_seed=order_seed, max_open=cap,
                                        backward_spy=lambda b, spies=spies: spies.append(_OpenStateSpy(b)) or spies[-1])
        assert float((streamed - reference).norm() / reference.norm()) <= 1e-5
        assert totals.peak_open_trajectories == cap  # reached, never exceeded
        assert max(spies[0].sizes) <= cap and totals.turns == sum(len(t) for t in trajectories)
    _, uncapped, _ = _streamed(student, trajectories, teacher, "gjsd", order_seed=0)
    assert uncapped.peak_open_trajectories > 2  # without the cap, more trajectories overlap on this order


def test_sync_schedule_and_naive_backward_give_the_same_direction(student):
    vocab = student.config.vocab_size
    trajectories = _trajectories(vocab)
    teacher = SeededTeacher(vocab)
    a, _, _ = _streamed(student, trajectories, teacher, "opd", order_seed=5)
    b, _, _ = _streamed(student, trajectories, teacher, "opd", order_seed=6, schedule="sync")
    c, _, _ = _streamed(student, trajectories, teacher, "opd", order_seed=7, cut=False)
    assert float((a - b).norm() / a.norm()) <= 1e-5
    assert float((a - c).norm() / a.norm()) <= 1e-5


class _ShortTeacher(SeededTeacher):
    def score(self, context_ids, action_ids):
        scores = super().score(context_ids, action_ids)
        return TeacherScores(scores.logprobs[:-1], scores.logits)


class _NaNTeacher(SeededTeacher):
    def score(self, context_ids, action_ids):
        scores = super().score(context_ids, action_ids)
        return TeacherScores(scores.logprobs * float("nan"), scores.logits)


@pytest.mark.parametrize("teacher_cls, match", [(_ShortTeacher, "must score every sampled token"),
                                                (_NaNTeacher, "NaN")])
def test_bad_teacher_answers_are_refused(student, teacher_cls, match):
    vocab = student.config.vocab_size
    with pytest.raises(TeacherScoringError, match=match):
        _streamed(student, _trajectories(vocab), teacher_cls(vocab), "opd", order_seed=0)


def test_turns_without_scored_tokens_and_an_empty_batch(student):
    vocab = student.config.vocab_size
    empty = [synthetic_trajectory(0, vocab, prompt=4, actions=[0, 0], framings=[2], seed=3)]
    with pytest.raises(NoScoredTokensError, match="zero scored action tokens"):
        _streamed(student, empty, SeededTeacher(vocab), "opd", order_seed=0)


def test_stale_turn_is_refused(student):
    vocab = student.config.vocab_size
    with pytest.raises(StalePolicyError, match="policy version 1"):
        _streamed(student, _trajectories(vocab), SeededTeacher(vocab), "opd", order_seed=0, version=1)


def test_thundersync_backpropagates_a_turn_before_the_next_turn_is_generated(student):
    """Streaming per turn: the engine below refuses to emit turn j+1 of a trajectory until the learner has finished
    the backward of turn j (it waits on an event the learner sets), so the batch can only complete if every turn's
    backward runs while its trajectory is still going."""
    import threading

    vocab = student.config.vocab_size
    trajectories = _trajectories(vocab)
    done = {(e.index, e.turn): threading.Event() for t in trajectories for e in t}

    class GatedEngine(ReplayTurnEngine):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            original = self.on_turn

            def on_turn(event):
                if event.turn > 0 and not done[(event.index, event.turn - 1)].wait(timeout=60):
                    raise AssertionError(f"turn {event.turn - 1} of trajectory {event.index} was not learned in time")
                original(event)

            self.on_turn = on_turn

    params = [p for p in student.parameters() if p.requires_grad]
    grads = GradientSum(params)
    backward = BoundaryCutBackward(student, params, _objective("opd"), grads)
    turn = backward.turn

    def recording_turn(event, teacher):
        outcome = turn(event, teacher)
        done[(event.index, event.turn)].set()
        return outcome

    backward.turn = recording_turn
    learner = DistillBatchLearner(batch_size=len(trajectories), policy_version=0, backward=backward, grads=grads)
    router = TurnRouter()
    requests = [RolloutRequest(i, i, (), 0) for i in range(len(trajectories))]
    totals, _ = run_distill_batch(GatedEngine(trajectories, router, order_seed=1), requests, 0, SeededTeacher(vocab),
                                  learner, router=router)
    assert totals.turns == sum(len(t) for t in trajectories)
