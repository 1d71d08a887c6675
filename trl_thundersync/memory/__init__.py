"""The memory plan of a run: what one learner process will hold, under stock TRL, `sync` and `thundersync`, before
the first rollout (`plan.py`); the caps chosen from `memory_budget` (`budget.py`); whether it fits the memory free
now (`available.py`). `python -m trl_thundersync.memory --model CONFIG ...` prints a plan without loading weights.
docs/memory.md says what is planned and what is not."""

from .available import check_fits, free_bytes, peak_resident_bytes
from .budget import Caps, choose_caps, parse_budget
from .plan import MemoryPlan, MemorySpec, PlanLine, plan_memory

__all__ = ["Caps", "MemoryPlan", "MemorySpec", "PlanLine", "check_fits", "choose_caps", "free_bytes", "parse_budget",
           "peak_resident_bytes", "plan_memory"]
