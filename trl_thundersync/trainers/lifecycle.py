"""What both ThunderSync trainers share around the optimizer step: each trajectory's sampling seed, and the callback
that publishes θ_{k+1} to the rollout engine once a generation batch is done.

A trainer using `PublishCallback` provides `_publish_due(global_step) -> bool` (is this optimizer step the last of its
generation batch? always, except between the passes of GRPO's `num_iterations > 1`), `_publish(global_step)` (push
the weights, wait for the engine's acknowledgement) and `_record_step(optimizer_end, publish_end)` (the step's trace
and timing metrics).
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


def trajectory_seed(run_seed: int, step: int, index: int) -> int:
    """Sampling seed of one trajectory, independent of arrival order and schedule."""
    return (run_seed * 1_000_003 + step * 65_537 + index) % (2**63 - 1)


class PublishCallback(TrainerCallback):
    """After each optimizer step: publish θ_{k+1} and wait for the engine's acknowledgement, when one is due."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        optimizer_end = time.perf_counter()
        if not self.trainer._publish_due(state.global_step):  # more passes over this generation batch follow
            self.trainer._record_step(optimizer_end, optimizer_end)
            return
        self.trainer._publish(state.global_step)
        self.trainer._record_step(optimizer_end, time.perf_counter())
