"""The GRPO step trace (`trace.recorder.build_step_trace`) and the metrics derived from it: learner TFLOP/s and MFU."""

from __future__ import annotations

from typing import Any

from ..trace.flops import ModelShape, learner_flops
from ..trace.recorder import build_step_trace
from ..trace.records import StepTrace
from .lifecycle import StepRecord


def step_trace(trainer: Any, step: StepRecord, optimizer_end: float, publish_end: float) -> StepTrace:
    """The step's trace: its landmarks, every learner work item (with its FLOP estimate) and the publication."""
    totals, timing = step.totals, step.timing
    return build_step_trace(
        step=step.version, schedule=trainer.args.schedule, start=timing.start, rollout_end=timing.rollout_end,
        work=totals.work, scored=step.items, optimizer_end=optimizer_end, publish_start=optimizer_end,
        publish_end=publish_end, stats_bytes=totals.peak_stats_bytes, flops_of=flops_of(trainer),
        peak_flops_per_s=trainer.args.peak_flops_per_s or 0.0,
    )


def trace_metrics(trainer: Any, trace: StepTrace) -> None:
    """Learner FLOPs and MFU of the step, from its trace."""
    m = trainer._metrics["train"]
    flops = sum(e.flops for e in trace.events)
    m["thundersync/learner_tflops_per_s"].append(flops / trace.wall / 1e12 if trace.wall else 0.0)
    if trainer.args.peak_flops_per_s:
        processes = trainer.accelerator.num_processes
        m["thundersync/trainer_active_mfu"].append(flops / trace.wall / trainer.args.peak_flops_per_s
                                                   if trace.wall else 0.0)
        m["thundersync/trainer_processes"].append(float(processes))


def flops_of(trainer: Any):
    """Learner FLOPs of a pass over n tokens (cached on the trainer), or None for a non-standard decoder config."""
    if not hasattr(trainer, "_flops_fn"):
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        config = getattr(unwrapped, "config", None)
        try:
            shape = ModelShape.from_config(config)
        except AttributeError:  # not a standard decoder config: no FLOP estimate rather than a wrong one
            trainer._flops_fn = None
            return None
        adapter = None
        if hasattr(unwrapped, "peft_config"):
            adapter = sum(p.numel() for p in trainer._trainable)
        trainer._flops_fn = lambda tokens: learner_flops(shape, tokens, adapter)
    return trainer._flops_fn
