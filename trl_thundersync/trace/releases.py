"""Every GRPO release point from one recorded trace: a trajectory's service is the same, only its τ moves.

`predict_release` replays one trace (Eq. 14, `replay.py`) under a release point — "reward" (its reward time),
"content" (its content-ready time) or "turn" (its turn ends) — so a trace of any schedule predicts them all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .records import StepTrace
from .replay import Replay, replay

RELEASE_MODES = ("reward", "content", "turn")  # ThunderSyncGRPOConfig.release
_WORK_KINDS = ("source_backward", "content_backward", "turn_backward", "turn_close")  # a trajectory's own service


@dataclass(frozen=True)
class TrajectoryWork:
    """What one trajectory of a recorded step asks of the learner, independent of when it was released."""

    index: int
    group: int
    content_ready: float  # its last turn ended (absolute seconds)
    reward_at: float  # its reward was known
    service: float  # Σ service of its backward items (whole, per turn, and the turn close), s
    bind_service: float  # Σ service of its bind items (0 in a trace without binds)
    turns: tuple[tuple[float, float], ...]  # (release time, service) per turn, summing to `service`; () if unknown


def _first(values: Iterable[float | None]) -> float | None:
    return next((v for v in values if v is not None), None)


def trajectory_work(step: StepTrace) -> dict[int, TrajectoryWork]:
    """Per trajectory index: its learner service and its content-ready, reward and turn-end times.

    Times come from the learner items' `content_ready` / `reward_at`; for traces without them (written before those
    fields existed), from the rollout lane: the trajectory's end is its content-ready time, its "reward" interval's
    end its reward time (else the `ready` of its reward-released backward). Turns: a turn-released trace's own
    "turn_backward" items (τ = turn end, their measured service; the turn close is released with the content);
    otherwise the rollout lane's "turn" events, the trajectory's service split over them in proportion to each
    turn's action tokens (evenly when the trace has no token counts), each released at its turn's end.
    """
    learner = [e for e in step.events if e.lane == "learner" and e.index >= 0 and e.kind in _WORK_KINDS + ("bind",)]
    by_index: dict[int, list] = {}
    for e in learner:
        by_index.setdefault(e.index, []).append(e)
    finished = {e.index: e.end for e in step.events if e.lane == "rollout" and e.kind == "trajectory"}
    scored = {e.index: e.end for e in step.events if e.lane == "rollout" and e.kind == "reward"}
    turn_events: dict[int, list] = {}
    for e in step.events:
        if e.lane == "rollout" and e.kind == "turn":
            turn_events.setdefault(e.index, []).append(e)
    out = {}
    for index, items in by_index.items():
        content = _first([e.content_ready for e in items] + [finished.get(index)])
        reward = _first([e.reward_at for e in items] + [scored.get(index)]
                        + [e.ready for e in items if e.kind in ("source_backward", "bind")])
        if content is None:
            content = _first(e.ready for e in items if e.kind == "content_backward")
        if content is None or reward is None:
            raise ValueError(f"step {step.step}: trajectory {index} has no content-ready or reward time in the trace")
        content = min(content, reward)  # a trajectory's tokens are fixed by the time it is graded
        work = [e for e in items if e.kind in _WORK_KINDS]
        service = math.fsum(e.end - e.start for e in work)
        bind = math.fsum(e.end - e.start for e in items if e.kind == "bind")
        own_turns = sorted((e for e in work if e.kind == "turn_backward"), key=lambda e: (e.turn, e.start))
        if own_turns:
            close = math.fsum(e.end - e.start for e in work if e.kind != "turn_backward")
            turns = tuple((min(e.ready if e.ready is not None else e.start, content), e.end - e.start)
                          for e in own_turns) + ((content, close),)
        elif turn_events.get(index):
            events = sorted(turn_events[index], key=lambda e: (e.turn, e.start))
            total = sum(e.tokens for e in events)
            shares = [e.tokens / total for e in events] if total > 0 else [1.0 / len(events)] * len(events)
            turns = tuple((min(e.end, content), service * share) for e, share in zip(events, shares, strict=True))
        else:
            turns = ()
        out[index] = TrajectoryWork(index=index, group=items[0].group, content_ready=content, reward_at=reward,
                                    service=service, bind_service=bind, turns=turns)
    return out


def release_items(step: StepTrace, mode: str) -> list[tuple[float, float]]:
    """The step's learner work as (τ_j, p_j) in readiness order, had it been released at `mode`.

    - "reward":  each trajectory's service (and its bind's) at its reward time — the paper's release;
    - "content": its service at its content-ready time, then a bind item (its measured bind service, 0 if the
      trace has none) at its reward time;
    - "turn":    its per-turn shares (`trajectory_work`) at their turn ends, then the bind at the reward time; a
      trajectory without turn information is released as under "content".
    A group fold (its measured service) is released when its group's last reward is known, in every mode; other
    items (stock TRL's whole-batch item) keep their recorded `ready`. Ties keep trajectory work before binds before
    folds, so one FIFO lane in readiness order respects every dependency.
    """
    if mode not in RELEASE_MODES:
        raise ValueError(f"mode={mode!r}: expected one of {RELEASE_MODES}")
    work = trajectory_work(step)
    keyed: list[tuple[float, int, int, float]] = []  # (τ, rank, index, p)
    first: dict[int, float] = {}  # group -> its first member's τ (a shared prefix is forwarded then)
    for w in work.values():
        if mode == "reward":
            items = [(w.reward_at, 0, w.index, w.service + w.bind_service)]
        elif mode == "turn" and w.turns:
            items = [(tau, 0, w.index, p) for tau, p in w.turns] + [(w.reward_at, 1, w.index, w.bind_service)]
        else:
            items = [(w.content_ready, 0, w.index, w.service), (w.reward_at, 1, w.index, w.bind_service)]
        keyed.extend(items)
        first[w.group] = min(first.get(w.group, math.inf), items[0][0])
    last_reward: dict[int, float] = {}
    for w in work.values():
        last_reward[w.group] = max(last_reward.get(w.group, w.reward_at), w.reward_at)
    for e in step.events:
        if e.lane != "learner" or (e.index >= 0 and e.kind in _WORK_KINDS + ("bind",)):
            continue
        if e.kind in ("group_fold", "prefix_backward") and e.group in last_reward:
            keyed.append((last_reward[e.group], 2, -1, e.end - e.start))
        elif e.kind == "prefix_forward" and e.group in first:
            keyed.append((first[e.group], -1, -1, e.end - e.start))
        else:
            keyed.append((e.ready if e.ready is not None else e.start, 2, -1, e.end - e.start))
    return [(tau, p) for tau, _, _, p in sorted(keyed)]


def predict_release(step: StepTrace, mode: str) -> Replay:
    """Replay one recorded step (Eq. 14) as if its learner work had been released at `mode`
    ("reward" | "content" | "turn", `release_items`), with the step's own R and serial suffix P.

    `.thundersync_time` is the predicted step time T = max(R, c_n) + P, `.sync_time` = R + L + P (every item at
    R), `.speedup` their ratio: the predicted speedup of that release point over `sync`. Any schedule's trace
    works: a sync trace gives every mode's prediction before running it.
    """
    suffix = max(0.0, step.publish_end - max(step.rollout_end, step.learner_end))
    return replay(release_items(step, mode), step.rollout_end, suffix, step.start)


def predict_releases(step: StepTrace) -> dict[str, Replay]:
    """`predict_release` for every release mode."""
    return {mode: predict_release(step, mode) for mode in RELEASE_MODES}

