"""The caps of a run's streamed state, chosen from a memory budget (`memory_budget`), and the budget's parsing.

A budget is the bytes one learner process may hold for the streamed state (the batch accumulator, group
statistics, release buffers, optional terms: the plan lines `STATE_LINES` names). Caps the user set
(`max_open_groups`, `max_buffered_trajectories`) are kept; the ones left at None are chosen from the budget:

- a number of bytes (or a string such as "2GB", "512MiB"): the most open groups whose statistics fit (at least one,
  else the run is refused naming the field), then as many release buffers as the rest holds;
- "auto" (the default): what thundersync holds beyond `sync` (the G1, G2 of its open groups, its release buffers)
  takes at most max(25% of the run's planned `sync` bytes, 384 MiB): the most open groups that fit (at least one),
  then as many release buffers as the rest holds. A small model keeps every group and buffer it needs; a large one
  plans at most a quarter more than `sync`, beyond the one open group it always keeps;
- None: no budget (every group open, a buffer for every trajectory of the batch).

With the streamed state planned on the host (`MemorySpec.host_state`, the paper's layout) the same rules apply to the
host's bytes.

Where no release buffer fits, `release="content"`/`"turn"` falls back to `"reward"`: the same update, learned at
each trajectory's reward instead of its end (the overlap of the reward's lag is what is given up). Admission stays
exact with any cap (`streaming/release.py`, `streaming/learner.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..errors import MemoryPlanError
from .plan import MemorySpec, buffer_vectors, plan_memory

STATE_LINES = ("batch accumulator", "group statistics", "release buffers", "optional terms")  # what a budget bounds
AUTO_FRACTION = 0.25  # "auto": what thundersync holds beyond sync, up to this share of the run's planned sync bytes...
AUTO_FLOOR = 384 * 2**20  # ...or this many bytes, whichever is larger
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}


def parse_budget(value) -> int | str | None:
    """`memory_budget` as bytes (int), "auto" or None; a ValueError naming the accepted forms otherwise."""
    if value is None or value == "auto":
        return value
    if isinstance(value, bool):
        raise ValueError(f"memory_budget={value!r}: expected a number of bytes, a string like '2GB', 'auto' or None")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"memory_budget={value!r}: expected a number of bytes, a string like '2GB' or '512MiB' "
                             "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), 'auto' or None")
        number, unit = float(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise ValueError(f"memory_budget={value!r} must be positive")
    return int(number * _UNITS[unit])


@dataclass(frozen=True)
class Caps:
    """The caps a run streams under, and why."""

    max_open_groups: int | None  # None: every group of the batch
    max_buffered_trajectories: int | None  # None: every trajectory of the batch
    release: str  # the release point (content/turn fall back to reward where no buffer fits)
    reason: str  # one line for the log: the budget and what it chose


def choose_caps(spec: MemorySpec, budget: int | str | None) -> Caps:
    """The caps of `spec` under `budget` (module docstring); `spec` carries the user's caps (None: to choose)."""
    groups = spec.batch_size // spec.num_generations
    if budget is None:
        return Caps(spec.max_open_groups, spec.max_buffered_trajectories, spec.release, "memory_budget=None: no caps")
    base = replace(spec, release="reward")  # the streamed state without release buffers

    where = "host" if spec.host_state else "device"  # where the streamed state lives

    def beyond(open_groups: int, schedule: str) -> int:  # bytes thundersync holds beyond `schedule`, no buffer
        plan = plan_memory(replace(base, max_open_groups=open_groups))
        return plan.total("thundersync", where) - plan.total(schedule, where)

    if budget == "auto":
        room = max(AUTO_FRACTION * plan_memory(replace(base, max_open_groups=1)).total("sync", where), AUTO_FLOOR)
        said = f"auto ({room / 2**20:,.0f} MiB beyond sync: 25% of its planned bytes, at least 384 MiB)"
        open_groups = spec.max_open_groups or _most_groups(lambda k: beyond(k, "sync"), groups, room)
        room = max(0, room - beyond(open_groups, "sync"))
    else:
        def state(open_groups: int) -> int:  # the streamed state's lines, without release buffers
            plan = plan_memory(replace(base, max_open_groups=open_groups))
            return sum(line.bytes for line in plan.lines if line.name in STATE_LINES)

        open_groups = spec.max_open_groups or _most_groups(state, groups, budget)
        if state(open_groups) > budget:
            field = "max_open_groups" if spec.max_open_groups else "memory_budget"
            raise MemoryPlanError(
                f"memory_budget={budget:,} bytes cannot hold the statistics of {open_groups} open group(s) "
                f"({state(open_groups):,} bytes of streamed state): raise memory_budget, lower {field}, or "
                "train fewer parameters (peft_config)")
        room, said = budget - state(open_groups), f"{budget:,} bytes"
    caps_groups = None if open_groups is None or open_groups >= groups else open_groups
    if spec.release == "reward" or spec.max_buffered_trajectories is not None:
        return Caps(caps_groups, spec.max_buffered_trajectories, spec.release, f"memory_budget {said}: caps as set")
    per_buffer = 4 * spec.trainable_params * buffer_vectors(spec)
    buffers = int(room // per_buffer) if per_buffer else spec.batch_size  # nothing trainable: buffers cost nothing
    if buffers >= spec.batch_size:
        return Caps(caps_groups, None, spec.release, f"memory_budget {said}: every trajectory may hold a buffer")
    if buffers == 0:
        return Caps(caps_groups, None, "reward",
                    f"memory_budget {said}: no release buffer of {per_buffer:,} bytes fits; release='reward'")
    return Caps(caps_groups, buffers, spec.release,
                f"memory_budget {said}: max_buffered_trajectories={buffers} ({per_buffer:,} bytes each)")


def _most_groups(cost, groups: int, budget: float) -> int:
    """The most open groups (≥ 1) whose `cost(k)` fits `budget`."""
    fitting = [k for k in range(1, groups + 1) if cost(k) <= budget]
    return fitting[-1] if fitting else 1
