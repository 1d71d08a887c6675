"""Teacher scoring per trajectory: one request covers every turn it can, the scores are the per-turn scores, the
streamed update is the same, and the ledger predicts the other schedule's prefill exactly."""

from __future__ import annotations

import json
import queue

import pytest
import torch

from benchmarks.turns import ReplayTurnEngine, SeededTeacher, synthetic_trajectory
from trl_thundersync.distill.learner import DistillBatchLearner, batch_direction
from trl_thundersync.distill.losses import opd_loss_sum
from trl_thundersync.distill.pipeline import DONE, TurnRouter, _teach, run_distill_batch
from trl_thundersync.distill.records import ScoredTurn, TrajectoryClosed
from trl_thundersync.distill.teacher import LocalTeacher
from trl_thundersync.distill.teacher_schedule import TeacherLedger, plan_requests, score_spans
from trl_thundersync.distill.turn_backward import BoundaryCutBackward, GradientSum
from trl_thundersync.errors import RolloutError
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer
from trl_thundersync.trace.recorder import build_step_trace
from trl_thundersync.types import Rollout, RolloutRequest, TurnEvent

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def models():
    tokenizer = build_tiny_tokenizer()
    student = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, seed=2).train()
    teacher = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, seed=5).eval()
    return student, teacher


def _trajectories(vocab):
    shapes = [([4, 3, 5], [2, 3]), ([6], []), ([3, 0, 4], [2, 1]), ([2, 5], [0])]
    return [synthetic_trajectory(i, vocab, prompt=5 + i, actions=a, framings=f, seed=10 + i)
            for i, (a, f) in enumerate(shapes)]


def test_nested_turns_are_one_request_whose_spans_are_the_actions():
    events = synthetic_trajectory(0, 500, prompt=6, actions=[3, 2, 4], framings=[5, 1], seed=1)
    (request,) = plan_requests(events)
    assert request.ids == events[-1].context_ids + events[-1].action_ids and request.turns == (0, 1, 2)
    for (start, end), event in zip(request.spans, events, strict=True):
        assert request.ids[start:end] == event.action_ids and request.ids[:start] == event.context_ids


def test_a_turn_whose_context_was_rewritten_gets_its_own_request():
    events = synthetic_trajectory(0, 500, prompt=6, actions=[3, 2, 4], framings=[5, 1], seed=1)
    rewritten = TurnEvent(0, 2, 0, (9,) + events[2].context_ids[1:], events[2].action_ids, 0.0)
    requests = plan_requests([*events[:2], rewritten])
    assert sorted(t for r in requests for t in r.turns) == [0, 1, 2] and len(requests) == 2
    assert next(r for r in requests if 2 in r.turns).turns == (2,)  # turns 0, 1 share the longest sequence they fit


def test_local_teacher_scores_spans_in_one_forward_as_per_turn(models):
    _, teacher_model = models
    teacher = LocalTeacher(teacher_model)
    events = synthetic_trajectory(0, teacher_model.config.vocab_size, prompt=6, actions=[3, 2, 4], framings=[5, 1],
                                  seed=1)
    calls = []
    forward = teacher_model.forward
    teacher_model.forward = lambda *a, **k: (calls.append(1), forward(*a, **k))[1]
    try:
        (request,) = plan_requests(events)
        spans = score_spans(teacher, request.ids, request.spans)
    finally:
        del teacher_model.forward
    assert len(calls) == 1
    for event, scores in zip(events, spans, strict=True):
        alone = teacher.score(event.context_ids, event.action_ids)
        assert torch.allclose(scores.logprobs, alone.logprobs, atol=1e-5)
        assert torch.allclose(scores.logits, alone.logits, atol=1e-5)


def test_a_scorer_without_score_spans_is_called_per_turn():
    teacher = SeededTeacher(500)
    events = synthetic_trajectory(0, 500, prompt=6, actions=[3, 2], framings=[5], seed=1)
    (request,) = plan_requests(events)
    for event, scores in zip(events, score_spans(teacher, request.ids, request.spans), strict=True):
        assert torch.equal(scores.logprobs, teacher.score(event.context_ids, event.action_ids).logprobs)


def _stream(student, teacher, trajectories, *, scoring, schedule="thundersync", order_seed=0):
    params = [p for p in student.parameters() if p.requires_grad]
    grads = GradientSum(params)
    objective = lambda logits, actions, scores: opd_loss_sum(logits, actions, scores.logprobs)  # noqa: E731
    learner = DistillBatchLearner(batch_size=len(trajectories), policy_version=0,
                                  backward=BoundaryCutBackward(student, params, objective, grads), grads=grads)
    router = TurnRouter()
    engine = ReplayTurnEngine(trajectories, router, order_seed=order_seed)
    requests = [RolloutRequest(i, i, (), 0) for i in range(len(trajectories))]
    items: list = []
    totals, timing = run_distill_batch(engine, requests, 0, teacher, learner, schedule=schedule,
                                       teacher_scoring=scoring, router=router, on_item=items.append)
    direction = torch.cat([d.reshape(-1) for d in batch_direction(totals.grads, totals.scored_tokens)])
    return direction, totals, timing, items


@pytest.mark.parametrize("schedule", ["thundersync", "sync"])
def test_trajectory_scoring_gives_the_per_turn_update_with_one_request_per_trajectory(models, schedule):
    student, teacher_model = models
    teacher = LocalTeacher(teacher_model)
    trajectories = _trajectories(student.config.vocab_size)
    per_turn, t_totals, t_timing, _ = _stream(student, teacher, trajectories, scoring="turn")
    per_traj, j_totals, j_timing, items = _stream(student, teacher, trajectories, scoring="trajectory",
                                                  schedule=schedule, order_seed=3)
    assert float((per_traj - per_turn).norm() / per_turn.norm()) <= 1e-5
    assert j_totals.scored_tokens == t_totals.scored_tokens and j_totals.turns == t_totals.turns
    turns = sum(len(t) for t in trajectories)  # every turn (an empty action too) is one per-turn request
    assert t_timing.teacher.requests == turns and j_timing.teacher.requests == len(trajectories)
    for timing in (t_timing, j_timing):  # the ledger's two costs do not depend on the schedule that ran
        assert timing.teacher.turn_schedule_tokens == t_timing.teacher.prefill_tokens
        assert timing.teacher.trajectory_schedule_tokens == j_timing.teacher.prefill_tokens
    assert j_timing.teacher.prefill_tokens == sum(len(t[-1].context_ids) + len(t[-1].action_ids) for t in trajectories)
    assert j_timing.teacher.prefill_tokens < t_timing.teacher.prefill_tokens
    # the trace shows one teacher interval per request, carrying every action token it scored
    rollouts = [item.rollout for item in items if isinstance(item, TrajectoryClosed)]
    trace = build_step_trace(step=0, schedule=schedule, timing=j_timing, work=j_totals.work, rollouts=rollouts,
                             optimizer_end=j_timing.barrier, publish_end=j_timing.barrier)
    lane = [e for e in trace.events if e.lane == "teacher"]
    assert len(lane) == len(trajectories) and sum(e.tokens for e in lane) == j_totals.scored_tokens


def test_a_trajectory_closed_before_its_turns_reached_the_teacher_is_an_error():
    events = synthetic_trajectory(0, 500, prompt=6, actions=[3, 2], framings=[5], seed=1)
    inbox, out = queue.Queue(), queue.Queue()
    rollout = Rollout(index=0, group=0, policy_version=0, prompt_ids=events[0].context_ids, completion_ids=(1,))
    for item in (events[0], TrajectoryClosed(rollout, 2, 0.0), DONE):
        inbox.put(item)
    _teach(SeededTeacher(500), None, "trajectory", TeacherLedger(), inbox, out)
    got = out.get_nowait()
    assert isinstance(got, RolloutError) and "closed after 2 turns but 1 turn events" in str(got)


def test_per_turn_scoring_forwards_each_turn_at_once():
    events = synthetic_trajectory(0, 500, prompt=6, actions=[3, 2], framings=[5], seed=1)
    inbox, out = queue.Queue(), queue.Queue()
    for item in (*events, DONE):
        inbox.put(item)
    ledger = TeacherLedger()
    _teach(SeededTeacher(500), None, "turn", ledger, inbox, out)
    scored = [out.get_nowait() for _ in range(2)]
    assert all(isinstance(s, ScoredTurn) and not s.shared for s in scored) and out.get_nowait() is DONE
    load = ledger.load()
    assert load.requests == 2 and load.prefill_tokens == load.turn_schedule_tokens == 9 + 16
    assert load.trajectory_schedule_tokens == 16


def test_the_teacher_scoring_benchmark_counts_the_closed_form(tmp_path):
    from benchmarks import teacher_scoring

    out = tmp_path / "t.json"
    teacher_scoring.main(["--turns", "3", "--trajectories", "2", "--hidden", "32", "--layers", "1", "--prompt", "8",
                          "--action", "4", "--observation", "5", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["turn"]["prefill_tokens"] == row["closed_form_tokens"]["turn"] == 2 * (3 * 12 + 9 * 3)
    assert row["trajectory"]["prefill_tokens"] == row["closed_form_tokens"]["trajectory"] == 2 * (8 + 12 + 10)
    assert row["turn"]["requests"] == 6 and row["trajectory"]["requests"] == 2
    assert row["max_abs_logprob_difference"] <= 1e-5
