"""One logical batch end to end: rollouts → scoring (producer thread) → learner (caller's thread) → barrier.

The producer thread drains `engine.results()` in completion order; it first hands each finished trajectory (its
tokens: content readiness) to the learner's queue, then to `score`, which returns the trajectories it releases (the
trajectory itself, or nothing until its group's / the batch's reward call is complete: `reward_scope.py`). Turn
events of agentic engines reach the same queue through a `TurnRouter` while the episode is still running. The
caller's thread runs the learner, in queue order: a trajectory's turns, then its content, then its reward. With a
`grade` callback (environment rewards graded concurrently, `grading.py`), the producer calls it on each trajectory
the moment it is delivered, and scoring always runs on its own thread, so gradings overlap. Under
`schedule="thundersync"` each item is handed to the learner as soon as it arrives (what the learner does with turns
and content depends on its release point, `release.py`); under `"sync"` the learner waits until the batch has
closed, then processes the scored sources in the same arrival order — the same code path, only the release time
differs.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..errors import RolloutError
from ..rollout.engine import RolloutEngine
from ..types import Rollout, RolloutRequest, ScoredRollout, TurnEvent
from .coalesce import CoalescedTurns, ReadyMembers, coalesce_turns, gather_members, take_ready
from .learner import BatchTotals, GRPOBatchLearner
from .learner_records import BatchTiming

DONE = object()  # the last thing a producer thread puts on its queue, after its items or its exception


class TurnRouter:
    """An agent engine's `on_turn` callback: forwards turn events to the open batch's learner queue.

    `required`: a turn event while no batch listens is an error (distillation scores every turn); otherwise it is
    work nobody asked for (a GRPO batch that does not release per turn) and is dropped."""

    def __init__(self, required: bool = True) -> None:
        self._target: queue.Queue | None = None
        self.required = required

    def __call__(self, event: TurnEvent) -> None:
        target = self._target
        if target is None:
            if self.required:
                raise RolloutError(f"turn event of trajectory {event.index} arrived while no batch is open")
            return
        target.put(event)

    def open(self, target: queue.Queue) -> None:
        self._target = target

    def close(self) -> None:
        self._target = None


def _produce(engine: RolloutEngine, score: Callable[[Rollout], Sequence[ScoredRollout]], out: queue.Queue,
             stop: threading.Event, delivered: list, content: bool,
             grade: Callable[[Rollout], None] | None = None) -> None:
    """Rollout thread: trajectories in completion order → scoring. With `content`, each trajectory's tokens go to the
    learner the moment the engine delivers it, and scoring runs on its own thread, so a slow grader (SWE tests, a
    judge, a group or batch call) never holds back the content of the trajectories finishing behind it. With
    `grade`, each delivered trajectory's grading starts at once, and scoring runs on its own thread in any case, so
    the next trajectory's grading never waits for this one's reward call."""
    if not content and grade is None:
        try:
            for rollout in engine.results():
                if stop.is_set():  # the learner failed: the batch is void, stop scoring
                    break
                delivered.append(rollout.index)
                for scored in score(rollout):
                    out.put(scored)
        except BaseException as exc:  # handed to the learner thread, which re-raises it
            out.put(exc)
        finally:
            out.put(DONE)
        return
    to_score: queue.Queue = queue.Queue()
    scorer = threading.Thread(target=_score_in_order, args=(score, to_score, out, stop), name="thundersync-scoring",
                              daemon=True)
    scorer.start()
    try:
        for rollout in engine.results():
            if stop.is_set():
                break
            delivered.append(rollout.index)
            if content:
                out.put(rollout)  # before its scoring is queued: the learner sees content, then the reward
            if grade is not None:
                grade(rollout)
            to_score.put(rollout)
    except BaseException as exc:
        out.put(exc)
    finally:
        to_score.put(DONE)
        scorer.join()
        out.put(DONE)


def _score_in_order(score: Callable[[Rollout], Sequence[ScoredRollout]], inbox: queue.Queue, out: queue.Queue,
                    stop: threading.Event) -> None:
    """Scoring thread: reward calls in the order the trajectories finished (TRL calls reward functions from one
    thread too); after a failure it only drains its queue."""
    failed = False
    while (rollout := inbox.get()) is not DONE:
        if failed or stop.is_set():
            continue
        try:
            for scored in score(rollout):
                out.put(scored)
        except BaseException as exc:
            failed = True
            out.put(exc)


def drain(inbox: queue.Queue, stop: threading.Event, on_item: Callable[[Any], None],
          coalesce: Callable[[list], list] | None = None) -> list:
    """Take items from a producer's queue until `DONE`, calling `on_item` on each as it arrives; returns them in
    arrival order. With `coalesce`, the items waiting are passed through it before each hand-over (`coalesce.py`:
    ready turns of one trajectory become one `CoalescedTurns`, and a turn that arrives while an earlier one of its
    trajectory still waits joins it). A producer's exception is re-raised here; any failure
    sets `stop` so producers quit a void batch."""
    arrived: list = []
    waiting: list = []  # taken from the inbox, not yet handed over (with `coalesce`: re-merged as more arrive)
    try:
        while True:
            if coalesce is None:
                item = inbox.get()
            else:
                if not waiting:
                    waiting.append(inbox.get())
                waiting = coalesce(take_ready(inbox, waiting, DONE))
                item = waiting.pop(0)
            if item is DONE:
                return arrived
            if isinstance(item, BaseException):
                raise item
            arrived.extend(item.events if isinstance(item, CoalescedTurns) else
                           item.sources if isinstance(item, ReadyMembers) else (item,))
            on_item(item)
    except BaseException:
        stop.set()
        raise


def tail_gather(learner: GRPOBatchLearner, delivered: list[int], requested: int) -> Callable[[list], list]:
    """The drain's `coalesce` under "thundersync" with `batch_members`: a group's ready members are gathered
    (`coalesce.gather_members`) only once every one of the `requested` trajectories is `delivered`, when the learner's
    backlog is the step's tail, the only learner time that lengthens the step. While rollouts run, members are
    learned one by one as they finish, as under content release: a busy learner then waits for the rollout anyway,
    and a padded pass would compete with generation for the cores (BENCHMARKS.md, "Members ready together")."""

    def completes(group: int, indices: list[int]) -> bool:
        return len(delivered) >= requested and learner.completes_group(group, indices)

    return partial(gather_members, completes=completes)


def run_logical_batch(
    engine: RolloutEngine,
    requests: Sequence[RolloutRequest],
    policy_version: int,
    score: Callable[[Rollout], Sequence[ScoredRollout]],
    learner: GRPOBatchLearner,
    schedule: str = "thundersync",
    on_source: Callable[[ScoredRollout], None] | None = None,
    turns: TurnRouter | None = None,
    grade: Callable[[Rollout], None] | None = None,
    coalesce: bool = True,
    batch_members: bool = True,
) -> tuple[BatchTotals, BatchTiming]:
    """`grade`: called on the rollout thread with each trajectory as it is delivered, before its `score` (starts
    its environment's grading, `RewardStage.start`); the caller ends what it starts once this returns or raises.
    `coalesce`: under turn release, ready turns of one trajectory are learned as one segment (`coalesce.py`).
    `batch_members`: the last members of a group, ready together, are learned in padded passes (`ready_groups.py`):
    under "sync" the whole batch, under "thundersync" the learner's backlog once every trajectory is delivered
    (`coalesce.gather_members`)."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    delivered: list[int] = []
    items = _stream_batch(engine, requests, policy_version, score, learner, schedule, on_source, turns, grade,
                          delivered, coalesce, batch_members)
    arrived = _scored_sources(items, delivered, len(requests))
    if schedule == "sync" and batch_members and learner.group_backward is not None:
        learner.submit_ready(arrived)
    elif schedule == "sync":
        for item in arrived:
            learner.submit(item)
    try:
        totals = learner.finish()
    except BaseException:
        learner.abort()
        raise
    barrier = time.perf_counter()
    rollout_end = max([s.scored_at for s in arrived], default=start)
    busy = sum(w.end - w.start for w in totals.work)
    order = tuple(s.rollout.index for s in arrived)
    return totals, BatchTiming(start, rollout_end, busy, barrier, arrival_order=order,
                               learner_cpu=time.thread_time() - cpu_start)


def _stream_batch(
    engine: RolloutEngine,
    requests: Sequence[RolloutRequest],
    policy_version: int,
    score: Callable[[Rollout], Sequence[ScoredRollout]],
    learner: GRPOBatchLearner,
    schedule: str,
    on_source: Callable[[ScoredRollout], None] | None,
    turns: TurnRouter | None,
    grade: Callable[[Rollout], None] | None,
    delivered: list[int],
    coalesce: bool = True,
    batch_members: bool = True,
) -> list:
    """Run the batch's rollouts on the producer thread and hand each item to the learner as it arrives (under
    "thundersync"); returns every item in arrival order. `delivered` collects the indices the engine delivered."""
    inbox: queue.Queue = queue.Queue()
    early = schedule == "thundersync" and learner.release != "reward"  # work before the reward
    if turns is not None and early and learner.release == "turn":
        turns.open(inbox)
    engine.start_batch(requests, policy_version)
    stop = threading.Event()
    producer = threading.Thread(target=_produce, args=(engine, score, inbox, stop, delivered, early, grade),
                                name="thundersync-rollouts", daemon=True)
    producer.start()

    def on_item(item: ScoredRollout | Rollout | TurnEvent | CoalescedTurns | ReadyMembers) -> None:
        if isinstance(item, ReadyMembers):
            for source in item.sources:
                if on_source is not None:
                    on_source(source)
            learner.submit_ready(item.sources)  # (only under "thundersync": `gather_members` runs only there)
        elif isinstance(item, TurnEvent):
            learner.submit_turn(item)
        elif isinstance(item, CoalescedTurns):
            learner.submit_turns(item.events)
        elif isinstance(item, Rollout):
            learner.submit_content(item)
        else:
            if on_source is not None:
                on_source(item)
            if schedule == "thundersync":
                learner.submit(item)

    try:
        per_turn = turns is not None and early and learner.release == "turn"
        gather = None
        if schedule == "thundersync" and not per_turn and batch_members and learner.group_backward is not None:
            gather = tail_gather(learner, delivered, len(requests))
        return drain(inbox, stop, on_item, coalesce_turns if per_turn and coalesce else gather)
    except BaseException:
        learner.abort()
        raise
    finally:
        if turns is not None:
            turns.close()
        producer.join(timeout=5.0)


def _scored_sources(items: list, delivered: list[int], requested: int) -> list[ScoredRollout]:
    """The scored trajectories among the arrived items; a batch that lost or never scored a trajectory is an error."""
    arrived: list[ScoredRollout] = [x for x in items if isinstance(x, ScoredRollout)]
    if len(delivered) != requested:
        raise RolloutError(f"the rollout engine delivered {len(delivered)} of {requested} trajectories")
    if len(arrived) != requested:  # every trajectory arrived, but some reward call never became complete
        unscored = sorted(set(delivered) - {s.rollout.index for s in arrived})
        raise RolloutError(f"{len(unscored)} delivered trajectories were never scored (first: {unscored[:5]}): their "
                           "group or batch reward call never became complete")
    return arrived
