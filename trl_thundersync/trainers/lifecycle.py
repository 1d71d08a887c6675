"""What both ThunderSync trainers share around the optimizer step: each trajectory's sampling seed, the callback
that publishes θ_{k+1} to the rollout engine once a generation batch is done, and the lifecycle mixin that owns
publication, the step trace, `close` and `train`.

Lifecycle of one run (`StreamingLifecycle`): `train()` opens the run's trace and runs TRL's loop; each streamed
batch leaves a `StepRecord` in `_open_step`; after each optimizer step `PublishCallback` asks `_publish_due`, calls
`_publish(global_step)` (push the weights, wait for the engine's acknowledgement) when it is, and `_record_step`
(the step's trace and timing metrics); `close()` (also when `train` fails) stops the engine and releases the trace.

A trainer using the mixin provides `_engine` (the rollout engine, None until built), `policy_version`,
`_publish_due(global_step) -> bool` (is this optimizer step the last of its generation batch? always, except between
the passes of GRPO's `num_iterations > 1`) and `_step_trace(step, optimizer_end, publish_end) -> StepTrace` (built with
`trace.recorder.build_step_trace`, its FLOPs counted by `_flops_of`); it may extend `_trace_metrics(trace)` (by
default the learner FLOP rate and MFU, `trace.recorder.flop_metrics`) and `close()`.
"""

from __future__ import annotations

import time
from functools import cached_property
from typing import Any, NamedTuple

from transformers import TrainerCallback

from ..rollout.engine import RolloutEngine
from ..streaming.flops import FlopCounter, model_flop_counter
from ..streaming.learner_records import BatchTiming
from ..trace.recorder import flop_metrics, open_run_trace
from .placement import learner_placement, unplaced_policy
from .rank_failure import RankFailureGuard


def trajectory_seed(run_seed: int, step: int, index: int) -> int:
    """Sampling seed of one trajectory, independent of arrival order and schedule."""
    return (run_seed * 1_000_003 + step * 65_537 + index) % (2**63 - 1)


class StepRecord(NamedTuple):
    """One streamed batch awaiting its optimizer step's trace (a NamedTuple: immutable, and indexable as the tuple
    it replaces)."""

    version: int  # policy version θ_k the batch was sampled with (= the optimizer step it feeds)
    totals: Any  # the learner's totals (`BatchTotals` for GRPO, `DistillTotals` for GKD)
    timing: BatchTiming  # wall-clock landmarks (start, rollout_end, learner_busy, barrier; GKD: the teacher's too)
    items: list  # what the trace is built from: GRPO's scored sources, GKD's scored turns and closed trajectories


def step_timing_metrics(timing: BatchTiming) -> dict[str, float]:
    """The `thundersync/*` timing metrics of one streamed batch (both trainers log the same names)."""
    wall = timing.barrier - timing.start
    out = {
        "thundersync/step_wall_seconds": wall,
        "thundersync/rollout_seconds": timing.rollout_end - timing.start,
        "thundersync/learner_busy_seconds": timing.learner_busy,
        "thundersync/learner_tail_seconds": timing.tail,
        "thundersync/learner_idle_fraction": max(0.0, 1.0 - timing.learner_busy / wall) if wall else 0.0,
    }
    if timing.learner_cpu is not None:  # CPU of the learner's thread: busy minus this is waiting for a core (on CPU)
        out["thundersync/learner_cpu_seconds"] = timing.learner_cpu
    if timing.turns_released is not None:  # GRPO turn release: 0 where the step ran as content release (adaptive)
        out["thundersync/turns_released"] = float(timing.turns_released)
    return out


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


class StreamingLifecycle:
    """Mixin (before TRL's trainer class in the bases) owning publication, the step trace, `close` and `train`."""

    _engine = None  # the rollout engine (built lazily by the trainer)
    _placement = None  # the `LearnerPlacement` of the training engine (built at the first streamed batch)
    _open_step: StepRecord | None = None  # the streamed batch whose optimizer step has not been traced yet
    _trace_writer = None  # the run's `TraceWriter` while `train` runs on the main process (None otherwise)
    last_trace = None  # `StepTrace` of the latest optimizer step

    @property
    def rollout_engine(self) -> RolloutEngine:
        """The `RolloutEngine` this trainer samples with, built on first use (from the config's rollout fields: that
        starts the rollout worker or servers) unless `use_turn_generator` gave one. The trainer publishes every new
        policy version to it and closes it when training ends."""
        return self._rollout_engine()

    def _rollout_engine(self) -> RolloutEngine:
        raise NotImplementedError

    _turn_generator = None  # the generator `use_turn_generator` was given (or the one the config's fields built)

    def evaluation_generator(self):
        """The `TurnGenerator` this run samples with (built on first use, like `rollout_engine`), serving the current
        policy version between batches: evaluations sample held-out episodes with it (`envs.suites.evaluate`),
        on the same servers and with the same sampling settings as training. None where TRL's own batch generation
        samples (rollout_func, rollout_engine='trl')."""
        uses_trl = getattr(self, "_uses_trl_generation", None)
        if uses_trl is not None and uses_trl():
            return None
        if self._engine is None and getattr(self, "accelerator", None) is not None and self.is_in_train:
            self._learner_placement()  # first, as for a batch: the engine starts from the placement's full weights
        self._rollout_engine()
        return self._turn_generator

    def _learner_placement(self):
        """Where the learner work runs and how the direction reaches the engine (`placement/`), built on first use:
        inside `train`, after `accelerator.prepare` wrapped the model."""
        if self._placement is None:
            self._placement = learner_placement(self.accelerator, self.args)
        return self._placement

    def _policy_module(self):
        """The policy with its full current weights, to publish or to start rollout servers from (on every process:
        with sharded parameters this gathers them)."""
        if self._placement is None:
            return unplaced_policy(self.accelerator, self.model)
        return self._placement.publish_module(self.model)

    def _publish(self, version: int) -> None:
        """Push θ to the rollout engine (it acknowledges before returning) and make `version` current."""
        if self._engine is not None:
            seconds = self._engine.publish(self._policy_module(), version)
            self._metrics["train"]["thundersync/publish_seconds"].append(seconds)
        self.policy_version = version

    def _record_step(self, optimizer_end: float, publish_end: float) -> None:
        """Close the step's trace: its wall time (and the trainer's `_trace_metrics`) into the logs, a JSON line on
        disk."""
        if self._open_step is None:
            return
        step, self._open_step = self._open_step, None
        trace = self._step_trace(step, optimizer_end, publish_end)
        self._metrics["train"]["thundersync/step_wall_with_publish_seconds"].append(trace.wall)
        self._trace_metrics(trace)
        if self._trace_writer is not None:
            self._trace_writer.append(trace)
        self.last_trace = trace

    def _step_trace(self, step: StepRecord, optimizer_end: float, publish_end: float):
        raise NotImplementedError

    def _trace_metrics(self, trace) -> None:
        """Metrics derived from a finished step's trace: the learner FLOP rate (and MFU with a known device peak)."""
        for name, value in flop_metrics(trace, self.accelerator.num_processes).items():
            self._metrics["train"][name].append(value)

    @cached_property
    def _flops_of(self) -> FlopCounter | None:
        """Learner FLOPs of one pass over a context of n tokens (`streaming.flops`), for `_step_trace`; built once, at
        the first step's trace (the model prepared, its trainable parameters `_trainable` known); None for a
        non-standard decoder config."""
        return model_flop_counter(self.accelerator.unwrap_model(self.model), self._trainable)

    def close(self) -> None:
        """Stop the rollout engine's worker and release the trace (also done at interpreter exit)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if self._trace_writer is not None:
            self._trace_writer.close()
            self._trace_writer = None

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        try:
            # the run's trace, held exclusively until close(): a second live run on this output_dir is refused here
            self._trace_writer = open_run_trace(self.args, self.accelerator.is_main_process, resume_from_checkpoint)
            # one process failing ends every process with its cause, within a bound (`rank_failure.py`)
            with RankFailureGuard(self.accelerator.process_index, self.accelerator.num_processes,
                                  self.args.ddp_timeout, step=lambda: self.state.global_step):
                return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self.close()
