"""One logical batch end to end: rollouts → scoring (producer thread) → learner (caller's thread) → barrier.

The producer thread drains `engine.results()` in completion order and hands each trajectory to `score`, which
returns the trajectories it releases (the trajectory itself, or nothing until its group's / the batch's reward call
is complete: `reward_scope.py`); the caller's thread runs the learner. Under `schedule="thundersync"` every scored
trajectory is handed to the learner as soon as it is released; under `"sync"` the learner waits until the batch has
closed, then processes the same sources in the same arrival order — the same code path, only the release time
differs.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import RolloutError
from ..rollout.engine import RolloutEngine
from ..types import Rollout, RolloutRequest, ScoredRollout
from .learner import BatchTotals, GRPOBatchLearner

DONE = object()  # the last thing a producer thread puts on its queue, after its items or its exception


@dataclass(frozen=True)
class BatchTiming:
    """Wall-clock landmarks of one logical batch (perf_counter seconds)."""

    start: float  # requests admitted
    rollout_end: float  # last trajectory scored: the rollout batch closed (R)
    learner_busy: float  # Σ service time of learner work items (L)
    barrier: float  # every learner item done
    arrival_order: tuple[int, ...]  # trajectory indices in the order they were scored

    @property
    def tail(self) -> float:
        """Learner time after the rollout batch closed."""
        return max(0.0, self.barrier - self.rollout_end)


def _produce(engine: RolloutEngine, score: Callable[[Rollout], Sequence[ScoredRollout]], out: queue.Queue,
             stop: threading.Event, delivered: list) -> None:
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


def drain(inbox: queue.Queue, stop: threading.Event, on_item: Callable[[Any], None]) -> list:
    """Take items from a producer's queue until `DONE`, calling `on_item` on each as it arrives; returns them in
    arrival order. A producer's exception is re-raised here; any failure sets `stop` so producers quit a void batch."""
    arrived: list = []
    try:
        while True:
            item = inbox.get()
            if item is DONE:
                return arrived
            if isinstance(item, BaseException):
                raise item
            arrived.append(item)
            on_item(item)
    except BaseException:
        stop.set()
        raise


def run_logical_batch(
    engine: RolloutEngine,
    requests: Sequence[RolloutRequest],
    policy_version: int,
    score: Callable[[Rollout], Sequence[ScoredRollout]],
    learner: GRPOBatchLearner,
    schedule: str = "thundersync",
    on_source: Callable[[ScoredRollout], None] | None = None,
) -> tuple[BatchTotals, BatchTiming]:
    start = time.perf_counter()
    engine.start_batch(requests, policy_version)
    inbox: queue.Queue = queue.Queue()
    stop = threading.Event()
    delivered: list[int] = []
    producer = threading.Thread(target=_produce, args=(engine, score, inbox, stop, delivered),
                                name="thundersync-rollouts", daemon=True)
    producer.start()

    def on_item(item: ScoredRollout) -> None:
        if on_source is not None:
            on_source(item)
        if schedule == "thundersync":
            learner.submit(item)

    try:
        arrived: list[ScoredRollout] = drain(inbox, stop, on_item)
    finally:
        producer.join(timeout=5.0)
    if len(delivered) != len(requests):
        raise RolloutError(f"the rollout engine delivered {len(delivered)} of {len(requests)} trajectories")
    if len(arrived) != len(requests):  # every trajectory arrived, but some reward call never became complete
        unscored = sorted(set(delivered) - {s.rollout.index for s in arrived})
        raise RolloutError(f"{len(unscored)} delivered trajectories were never scored (first: {unscored[:5]}): their "
                           "group or batch reward call never became complete")
    if schedule == "sync":
        for item in arrived:
            learner.submit(item)
    totals = learner.finish()
    barrier = time.perf_counter()
    rollout_end = max([s.scored_at for s in arrived], default=start)
    busy = sum(w.end - w.start for w in totals.work)
    order = tuple(s.rollout.index for s in arrived)
    return totals, BatchTiming(start, rollout_end, busy, barrier, order)
