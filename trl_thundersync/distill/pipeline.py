"""One logical distillation batch end to end: rollouts → teacher thread → learner (caller's thread) → totals.

    results thread   drains `engine.results()`; a single-turn engine's rollout becomes one turn event; every
                     finished trajectory becomes a `TrajectoryClosed` after its turns
    agent loop       (multi-turn engines) emits each `TurnEvent` through the `TurnRouter` the moment its action is
                     complete — while the tool runs
    teacher thread   scores turns in arrival order (queue wait and scoring time recorded) and forwards them; with
                     `teacher_scoring="trajectory"` it holds a trajectory's turns until its close and scores them
                     with one request (`teacher_schedule`: cheaper prefill, later release)
    learner          `schedule="thundersync"`: every scored turn's backward runs at once; `"sync"`: the learner
                     waits until the batch has closed, then processes the same items in the same order

Both sources enter one FIFO queue and the agent loop emits a trajectory's turn events before the trajectory
finishes, so the teacher sees a trajectory's turns before its close; the learner does not rely on it anyway.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence

from ..errors import RolloutError
from ..rollout.engine import RolloutEngine
from ..streaming.learner_records import BatchTiming
from ..streaming.pipeline import DONE, TurnRouter, drain
from ..types import RolloutRequest, TurnEvent
from .learner import DistillBatchLearner
from .records import DistillTotals, ScoredTurn, TrajectoryClosed
from .teacher import TeacherScorer, check_teacher_scores
from .teacher_schedule import TeacherLedger, TeacherScoring, plan_requests, score_spans


def _results(engine: RolloutEngine, single_turn: bool, out: queue.Queue, stop: threading.Event) -> None:
    try:
        for rollout in engine.results():
            if stop.is_set():
                break
            if single_turn:
                out.put(TurnEvent(rollout.index, 0, rollout.policy_version, tuple(rollout.prompt_ids),
                                  tuple(rollout.completion_ids), rollout.finished_at or time.perf_counter()))
            turns = rollout.agent.turns if rollout.agent is not None else 1
            out.put(TrajectoryClosed(rollout, turns, time.perf_counter()))
    except BaseException as exc:  # re-raised in the learner's thread
        out.put(exc)
    finally:
        out.put(DONE)


def _teach(teacher: TeacherScorer, vocab_size: int | None, scoring: TeacherScoring, ledger: TeacherLedger,
           inbox: queue.Queue, out: queue.Queue) -> None:
    """Teacher thread: per turn on arrival (`"turn"`), or a trajectory's turns at its close (`"trajectory"`)."""
    held: dict[int, list[TurnEvent]] = {}  # "trajectory": turn events waiting for their trajectory's close
    while True:
        item = inbox.get()
        try:
            if isinstance(item, TurnEvent):
                ledger.observe(item)
                if scoring == "turn":
                    _score(teacher, vocab_size, [item], ledger, out)
                else:
                    held.setdefault(item.index, []).append(item)
            else:
                if isinstance(item, TrajectoryClosed) and scoring == "trajectory":
                    events = held.pop(item.rollout.index, [])
                    if len(events) != item.turns:
                        raise RolloutError(f"trajectory {item.rollout.index} closed after {item.turns} turns but "
                                           f"{len(events)} turn events reached the teacher before its close")
                    _score(teacher, vocab_size, events, ledger, out)
                out.put(item)
        except BaseException as exc:
            out.put(exc)
            return
        if item is DONE or isinstance(item, BaseException):
            return


def _score(teacher: TeacherScorer, vocab_size: int | None, events: list[TurnEvent], ledger: TeacherLedger,
           out: queue.Queue) -> None:
    """Score `events` (one trajectory's) with the fewest covering requests; forward each turn, checked."""
    for request in plan_requests(events):
        start = time.perf_counter()
        scores = score_spans(teacher, request.ids, request.spans)
        end = time.perf_counter()
        ledger.count(request, end - start)
        for position, turn_scores in zip(request.turns, scores, strict=True):
            event = events[position]
            check_teacher_scores(turn_scores, len(event.action_ids), vocab_size,
                                 f"trajectory {event.index} turn {event.turn}")
            out.put(ScoredTurn(event, turn_scores, start, end, shared=len(request.turns) > 1))


def run_distill_batch(
    engine: RolloutEngine,
    requests: Sequence[RolloutRequest],
    policy_version: int,
    teacher: TeacherScorer,
    learner: DistillBatchLearner,
    *,
    schedule: str = "thundersync",
    teacher_scoring: TeacherScoring = "turn",
    router: TurnRouter | None = None,
    logits_vocab_size: int | None = None,
    on_item: Callable[[ScoredTurn | TrajectoryClosed], None] | None = None,
) -> tuple[DistillTotals, BatchTiming]:
    """`router`: the `TurnRouter` a multi-turn engine emits through (None: the engine is single-turn).
    `logits_vocab_size`: require full-vocabulary teacher logits of this width (generalized JSD).
    `teacher_scoring`: one teacher request per turn, or per trajectory at its close (`teacher_schedule`)."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    to_teacher: queue.Queue = queue.Queue()
    inbox: queue.Queue = queue.Queue()
    stop = threading.Event()
    ledger = TeacherLedger()
    if router is not None:
        router.open(to_teacher)
    engine.start_batch(requests, policy_version)
    threads = [
        threading.Thread(target=_results, args=(engine, router is None, to_teacher, stop), daemon=True,
                         name="thundersync-distill-rollouts"),
        threading.Thread(target=_teach, args=(teacher, logits_vocab_size, teacher_scoring, ledger, to_teacher, inbox),
                         daemon=True,
                         name="thundersync-teacher"),
    ]
    for thread in threads:
        thread.start()

    def handle(item: ScoredTurn | TrajectoryClosed) -> None:
        if on_item is not None:
            on_item(item)
        if schedule == "thundersync":
            learner.submit(item)

    try:
        arrived: list[ScoredTurn | TrajectoryClosed] = drain(inbox, stop, handle)
    finally:
        if router is not None:
            router.close()
        for thread in threads:
            thread.join(timeout=5.0)
    closed = sum(isinstance(item, TrajectoryClosed) for item in arrived)
    if closed != len(requests):
        raise RolloutError(f"the rollout engine delivered {closed} of {len(requests)} trajectories")
    if schedule == "sync":
        for item in arrived:
            learner.submit(item)
    totals = learner.finish()
    barrier = time.perf_counter()
    # R: the last input fixed (a turn scored or a trajectory finished), not when the busy learner picked it up
    rollout_end = max((i.scored_at if isinstance(i, ScoredTurn) else i.closed_at for i in arrived), default=start)
    return totals, BatchTiming(
        start=start, rollout_end=rollout_end, learner_busy=sum(w.end - w.start for w in totals.work),
        barrier=barrier, teacher_wait=sum(w.teacher.wait for w in totals.work if w.teacher is not None),
        teacher=ledger.load(), learner_cpu=time.thread_time() - cpu_start,
    )
