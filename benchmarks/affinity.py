"""CPU pinning for `--pin`: the learner on one core, the rollout side (agent loops, tools, sandboxes) on the others.

Linux `sched_setaffinity(0, ...)` sets the affinity of the *calling thread* only, and new threads and child
processes inherit the affinity of the thread that creates them. So the benchmark pins its main thread (the learner:
`training_step` runs there, with one torch thread) to the learner core, and builds the rollout side's thread pools
with an initializer that pins each worker to the rollout cores; sandbox processes started from those workers
inherit it. The per-batch producer thread (scoring) is started by the learner thread and stays on its core: it only
hashes transcripts and hands work over.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass(frozen=True)
class CorePlan:
    """Which CPUs each side may run on."""

    learner: frozenset[int]  # the learner thread (and the scoring thread it starts)
    rollout: frozenset[int]  # agent loops, scripted generation, tool calls and their sandbox processes


def split_cores(available: set[int] | frozenset[int]) -> CorePlan:
    """The highest-numbered CPU for the learner, the rest for rollout; needs ≥ 2 CPUs."""
    cores = sorted(available)
    if len(cores) < 2:
        raise ValueError(f"pinning needs at least 2 CPUs to split, this process may use {cores}")
    return CorePlan(learner=frozenset(cores[-1:]), rollout=frozenset(cores[:-1]))


def current_plan() -> CorePlan:
    """`split_cores` of the CPUs this process may use."""
    return split_cores(os.sched_getaffinity(0))


def pin_thread(cores: frozenset[int]) -> None:
    """Restrict the calling thread (not the whole process) to `cores`."""
    os.sched_setaffinity(0, cores)


def pinned_pool(max_workers: int, cores: frozenset[int], name: str) -> ThreadPoolExecutor:
    """A thread pool whose workers pin themselves to `cores` when they start."""
    return ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name, initializer=pin_thread,
                              initargs=(cores,))


def busy_cpu_seconds() -> float:
    """Machine-wide busy CPU seconds so far (/proc/stat: everything but idle and iowait)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    busy = sum(values) - values[3] - (values[4] if len(values) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")
