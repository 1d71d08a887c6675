"""Boundary-cut backward (deferred state adjoints) equals the naive per-turn backward; objectives match TRL's GKD."""

from __future__ import annotations

import pytest
import torch
from trl.experimental.gkd import GKDTrainer

from benchmarks.turns import SeededTeacher, synthetic_trajectory
from trl_thundersync.distill.losses import generalized_jsd_per_token, opd_loss_sum
from trl_thundersync.distill.turn_backward import BoundaryCutBackward, GradientSum, NaiveTurnBackward
from trl_thundersync.errors import TurnOrderError
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def student():
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=2, seed=1)
    model.train()
    return model


def _objective(kind: str):
    if kind == "opd":
        return lambda logits, actions, teacher: opd_loss_sum(logits, actions, teacher.logprobs)
    return lambda logits, actions, teacher: generalized_jsd_per_token(logits, teacher.logits, beta=0.3).sum()


def _run(backward_cls, model, trajectories, kind):
    params = [p for p in model.parameters() if p.requires_grad]
    grads = GradientSum(params)
    teacher = SeededTeacher(model.config.vocab_size)
    backward = backward_cls(model, params, _objective(kind), grads)
    losses = []
    for events in trajectories:
        for event in events:
            losses.append(backward.turn(event, teacher.score(event.context_ids, event.action_ids)).loss_value)
        backward.close(events[0].index)
    return torch.cat([b.reshape(-1) for b in grads.buffers]), sum(losses)


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("kind", ["opd", "gjsd"])
def test_boundary_cut_equals_naive(student, kind):
    vocab = student.config.vocab_size
    trajectories = [
        synthetic_trajectory(0, vocab, prompt=6, actions=[4, 5, 3, 6], framings=[3, 2, 4], seed=0),
        # an action right after the previous one (empty framing: the logits-row proxy) and an empty action
        synthetic_trajectory(1, vocab, prompt=5, actions=[3, 4, 0, 5], framings=[0, 2, 3], seed=1),
        synthetic_trajectory(2, vocab, prompt=4, actions=[7], framings=[], seed=2),
    ]
    naive, naive_loss = _run(NaiveTurnBackward, student, trajectories, kind)
    cut, cut_loss = _run(BoundaryCutBackward, student, trajectories, kind)
    assert naive.norm() > 0
    assert _rel(cut, naive) <= 1e-5
    assert cut_loss == pytest.approx(naive_loss, rel=1e-5)


def test_boundary_cut_without_replay_is_wrong(student):
    """The deferred adjoints carry real signal: dropping the replay changes the gradient (the test can fail)."""
    vocab = student.config.vocab_size
    events = synthetic_trajectory(0, vocab, prompt=6, actions=[4, 5, 3], framings=[3, 2], seed=3)
    naive, _ = _run(NaiveTurnBackward, student, [events], "opd")
    params = [p for p in student.parameters() if p.requires_grad]
    grads = GradientSum(params)
    teacher = SeededTeacher(vocab)
    backward = BoundaryCutBackward(student, params, _objective("opd"), grads)
    for event in events:
        backward.turn(event, teacher.score(event.context_ids, event.action_ids))
    partial = torch.cat([b.reshape(-1) for b in grads.buffers])
    assert _rel(partial, naive) > 1e-3


def test_rewritten_history_is_refused(student):
    vocab = student.config.vocab_size
    events = synthetic_trajectory(0, vocab, prompt=6, actions=[4, 5], framings=[3], seed=4)
    params = [p for p in student.parameters() if p.requires_grad]
    backward = BoundaryCutBackward(student, params, _objective("opd"), GradientSum(params))
    teacher = SeededTeacher(vocab)
    backward.turn(events[0], teacher.score(events[0].context_ids, events[0].action_ids))
    bad = events[1].__class__(0, 1, 0, (1,) + events[1].context_ids[1:], events[1].action_ids, 0.0)
    with pytest.raises(TurnOrderError, match="does not extend"):
        backward.turn(bad, teacher.score(bad.context_ids, bad.action_ids))


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_generalized_jsd_matches_trl(beta):
    g = torch.Generator().manual_seed(0)
    student = torch.randn(2, 5, 11, generator=g).requires_grad_()
    teacher = torch.randn(2, 5, 11, generator=g)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    labels[0, :2] = -100
    reference = GKDTrainer.generalized_jsd_loss(student, teacher, labels, beta=beta)
    (ref_grad,) = torch.autograd.grad(reference, student)
    mask = labels != -100
    ours = generalized_jsd_per_token(student[mask], teacher[mask], beta=beta).sum() / mask.sum()
    (our_grad,) = torch.autograd.grad(ours, student)
    assert float(ours.detach()) == pytest.approx(float(reference.detach()), rel=1e-5)
    assert torch.allclose(our_grad, ref_grad, rtol=1e-4, atol=1e-7)


def test_opd_gradient_is_advantage_weighted_score():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 9, generator=g).requires_grad_()
    actions = torch.tensor([1, 4, 4, 8])
    teacher = torch.log_softmax(torch.randn(4, 9, generator=g), -1).gather(-1, actions[:, None]).squeeze(-1)
    (grad,) = torch.autograd.grad(opd_loss_sum(logits, actions, teacher), logits)
    logps = torch.log_softmax(logits, -1).gather(-1, actions[:, None]).squeeze(-1)
    advantage = (teacher - logps).detach()
    (expected,) = torch.autograd.grad(-(advantage * logps).sum(), logits)
    assert torch.allclose(grad, expected, atol=1e-7)
