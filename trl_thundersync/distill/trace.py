"""One distillation step as a `StepTrace`: rollouts (trajectories, turns, tool calls), the teacher lane (scoring of
each turn, its queue wait as `ready`; one event per request: under teacher_scoring="trajectory" it carries the
trajectory's last turn, the first turn's action time as `ready` and the action tokens of every turn it scored),
learner items (turn backward, context replay), barrier and publication."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..trace.records import StepTrace, TraceEvent
from .records import DistillTotals, ScoredTurn, TrajectoryClosed


def distill_step_trace(*, step: int, schedule: str, start: float, rollout_end: float, totals: DistillTotals,
                       items: Sequence[ScoredTurn | TrajectoryClosed], optimizer_end: float, publish_end: float
                       ) -> StepTrace:
    events: list[TraceEvent] = []
    requests: dict[tuple[int, float], int] = {}  # (trajectory, start) → its teacher event (one per request)
    for item in items:
        if isinstance(item, ScoredTurn):
            e = item.event
            key = (e.index, item.scoring_start)
            if item.shared and key in requests:  # another turn of the same request: its tokens join that event
                k = requests[key]
                events[k] = replace(events[k], turn=e.turn, tokens=events[k].tokens + len(e.action_ids))
                continue
            requests[key] = len(events)
            events.append(TraceEvent("teacher", "teacher_score", item.scoring_start, item.scored_at, e.index, -1,
                                     e.turn, e.policy_version, e.time, len(e.action_ids)))
            continue
        r = item.rollout
        events.append(TraceEvent("rollout", "trajectory", r.started_at, r.finished_at, r.index, -1, -1,
                                 r.policy_version, None, len(r.completion_ids)))
        if r.agent is not None:
            for turn, (s, t) in enumerate(r.agent.turn_intervals):
                events.append(TraceEvent("rollout", "turn", s, t, r.index, -1, turn, r.policy_version))
            for s, t in r.agent.tool_intervals:
                events.append(TraceEvent("tool", "tool_call", s, t, r.index, -1, -1, r.policy_version))
    for w in totals.work:
        events.append(TraceEvent("learner", w.kind, w.start, w.end, w.index, -1, w.turn, w.policy_version, w.ready,
                                 w.tokens))
    learner_end = max((w.end for w in totals.work), default=rollout_end)
    events.append(TraceEvent("barrier", "optimizer", max(learner_end, rollout_end), optimizer_end, policy_version=step))
    if publish_end > optimizer_end:
        events.append(TraceEvent("publish", "publish", optimizer_end, publish_end, policy_version=step + 1))
    return StepTrace(step=step, schedule=schedule, start=start, rollout_end=rollout_end, learner_end=learner_end,
                     barrier_end=optimizer_end, publish_end=publish_end, events=tuple(events))
