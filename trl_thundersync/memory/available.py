"""Whether a plan can fit: the memory free now on the learner's device, and the check run before the first rollout.

The check compares what the run has yet to allocate (gradients, optimizer state, replica, streamed state: every plan
line but the weights and the reference model, which are resident when the trainer is built) with what the device
has free now (CUDA: `torch.cuda.mem_get_info`; CPU: the host's available memory). It refuses only what cannot fit;
activations and fragmentation come on top, so passing it is no promise.
"""

from __future__ import annotations

import resource

import psutil
import torch

from ..errors import MemoryPlanError
from .plan import MemoryPlan, human_bytes

RESIDENT = ("framework", "weights", "reference model")  # plan lines already allocated when the trainer is built


def free_bytes(device: torch.device | str) -> int:
    """Bytes free now on `device` (a CUDA device's free memory, else the host's available memory)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def pending_bytes(plan: MemoryPlan, schedule: str) -> int:
    """What `schedule` has yet to allocate once the trainer is built."""
    return plan.total(schedule) - sum(line.bytes for line in plan.lines if line.name in RESIDENT)


def check_fits(plan: MemoryPlan, schedule: str, free: int) -> None:
    """MemoryPlanError naming the fields to change, when the run's pending bytes exceed `free`."""
    need = pending_bytes(plan, schedule)
    if need <= free:
        return
    lines = ", ".join(f"{line.name} {human_bytes(line.bytes)}" for line in plan.lines
                      if line.name not in RESIDENT and line.bytes)
    floor = pending_bytes(plan, "trl")
    fix = ("even stock TRL's gradients and optimizer state do not fit: train fewer parameters (peft_config) or use "
           "a larger device" if floor > free else
           "set memory_budget (or lower max_open_groups, max_buffered_trajectories; release='reward' holds no "
           "buffer), or train fewer parameters (peft_config)")
    raise MemoryPlanError(f"the memory plan needs {human_bytes(need)} more on {plan.device} ({lines}) but "
                          f"{human_bytes(free)} are free: {fix}")


def current_resident_bytes() -> int:
    """This process's resident set now."""
    return psutil.Process().memory_info().rss


def peak_resident_bytes(device: torch.device | str) -> int:
    """The measured peak: a CUDA device's peak allocated bytes, else this process's peak resident set."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
