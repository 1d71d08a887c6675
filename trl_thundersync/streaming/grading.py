"""Environment rewards graded concurrently: each environment's `get_reward()` on a bounded pool, from delivery on.

TRL appends one wrapper per environment class after the user's reward functions,
`get_reward(environments, **kwargs) -> [e.get_reward() if type(e) is that class else None for e in environments]`:
row r of any call depends only on environment r, whose episode is over once its trajectory is delivered. So
`GradingPool.start` calls the wrappers on that trajectory alone (the very call `reward_scope="trajectory"` makes, async
wrappers included) on a worker thread the moment the rollout engine hands the trajectory out, and the trajectory's,
group's or batch's reward call later takes those values instead of calling the wrappers again: same values, same
user calls, but k graders (SWE test runs, judges) run at once instead of one after the other on the scoring thread.

User reward functions are not touched: `RewardStage` still calls them from its one scoring thread, in the same call
shapes and order, and only after the call's environments are graded, so no environment is ever used by two threads
at once (its tools finished before delivery; its `get_reward` finished before any user function receives it).

Lifecycle: one pool per logical batch; `close()` (always, also on abort or Ctrl-C) cancels gradings not yet started
and waits for the running ones, so none outlives its batch (the engine reuses environment instances next batch).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from .rewards import RewardContext, RewardScorer, ScoringInput

# Default number of concurrent gradings: twice the cores, at most 8. A sandboxed test run is partly CPU and partly
# waiting (process and namespace start-up, workspace copies; a remote judge is all waiting): 8 no-op SWE gradings on
# 2 busy cores took 4.4-5.8 s serially, 2.9-4.2 s with 2 workers, 1.9-2.9 s with 4, 1.9-2.3 s with 8. The cap bounds
# threads and concurrent sandboxes on large machines.
GRADING_WORKERS_PER_CORE = 2
DEFAULT_MAX_GRADING_WORKERS = 8


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def grading_workers(configured: int | None, trajectories: int) -> int:
    """Worker count for one batch: `configured`, or min(2 × cores, 8); never more than the batch's trajectories."""
    workers = configured if configured is not None else min(GRADING_WORKERS_PER_CORE * available_cores(),
                                                            DEFAULT_MAX_GRADING_WORKERS)
    return max(1, min(workers, trajectories))


class GradingPool:
    """Grades `funcs` (indices of the scorer's environment-reward wrappers) per trajectory on `workers` threads.

    `start(item)` is called once per trajectory, from the thread that delivers it; `result(index)` (from the scoring
    thread) blocks until that trajectory is graded and returns {function index: value}, re-raising the grader's
    `RewardFunctionError` (which names the function and the trajectory).
    """

    def __init__(self, scorer: RewardScorer, funcs: Sequence[int], workers: int, context: RewardContext) -> None:
        self.scorer = scorer
        self.funcs = tuple(funcs)
        self.context = context
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="thundersync-grading")
        self._futures: dict[int, Future] = {}

    def start(self, item: ScoringInput) -> None:
        self._futures[item.rollout.index] = self._pool.submit(self._grade, item)

    def _grade(self, item: ScoringInput) -> dict[int, float]:
        return {i: self.scorer.values(i, [item], self.context)[0] for i in self.funcs}

    def result(self, index: int) -> dict[int, float]:
        return self._futures.pop(index).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._futures.clear()
