"""Trace records of training steps: what ran where and when (perf_counter seconds), for exports and the model.

One `StepTrace` per optimizer step. Lanes: "rollout" (trajectory generation, per trajectory), "tool" (tool calls),
"learner" (per-source backward passes and group folds), "barrier" (normalize, clip, optimizer step),
"publish" (weights to the rollout engine, acknowledged) and, in distillation, "teacher" (a turn's teacher scoring);
the `Literal` aliases below name every lane and kind. The scheduling model (paper Appendix F) reads the learner
lane's (ready, start, end) and the step landmarks; exports turn a list of steps into Chrome/Perfetto JSON and a PNG.

Learner kinds: "source_backward" (a trajectory's backward at reward release), "content_backward" (its backward at
content readiness, before the reward), "turn_backward" (one agentic turn's backward while its tool runs),
"turn_close" (a turn-released trajectory's deferred adjoints and final scalars), "bind" (a buffered H_i folded into
its group once the reward is known), "group_fold" and "router_aux" (the MoE load-balancing term of one TRL
micro-batch), "prefix_forward" / "prefix_backward" (a GRPO group's shared prompt forwarded once, and
back-propagated once with its members' folded boundary adjoints); stock TRL's whole-batch item is
"score_loss_backward". Each per-trajectory item carries its
trajectory's content-ready and reward times, so one trace replays every release point (`model.predict_release`).
Traces written before these fields existed load with them None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TraceLane = Literal["rollout", "tool", "learner", "barrier", "publish", "teacher"]
# Rollout lane: a trajectory, one agent turn, the wait for its reward; stock TRL's whole batch and its grading.
RolloutKind = Literal["trajectory", "turn", "reward", "generate_batch", "grading"]
# Learner lane (module docstring); "context_replay": distillation's deferred context adjoints when a trajectory closes.
LearnerKind = Literal["source_backward", "content_backward", "turn_backward", "turn_close", "bind", "group_fold",
                      "router_aux", "context_replay", "score_loss_backward", "prefix_forward", "prefix_backward"]
TraceKind = Literal[RolloutKind, "tool_call", LearnerKind, "teacher_score", "optimizer", "publish"]


@dataclass(frozen=True)
class TraceEvent:
    """One interval on one lane."""

    lane: TraceLane
    kind: TraceKind  # tool lane: "tool_call"; teacher: "teacher_score"; barrier: "optimizer"; publish: "publish"
    start: float  # seconds (perf_counter, same clock for every event of the run)
    end: float
    index: int = -1  # trajectory index in the batch (-1: not per trajectory)
    group: int = -1  # GRPO group (-1: none)
    turn: int = -1  # agent turn (-1: none)
    policy_version: int = -1  # version the work was bound to
    ready: float | None = None  # learner items: τ, when this item's inputs were fixed (the release point it ran at)
    tokens: int = 0  # scored tokens of a learner item / generated tokens of a rollout item (a turn's action tokens)
    flops: float = 0.0  # estimated FLOPs of a learner item (paper Appendix B: 6·N·tokens for forward+backward)
    content_ready: float | None = None  # per-trajectory learner items: when its last turn ended (tokens fixed)
    reward_at: float | None = None  # per-trajectory learner items: when its reward was known (None: not yet / never)


@dataclass(frozen=True)
class StepTrace:
    """Everything recorded for one optimizer step (one logical batch)."""

    step: int  # optimizer step index (the policy version the batch was sampled with)
    schedule: str  # "thundersync" or "sync" (or "trl" for stock TRL, recorded by the benchmark)
    start: float  # batch admitted (requests sent)
    rollout_end: float  # R: the last trajectory's reward known
    learner_end: float  # c_n: the last learner item finished
    barrier_end: float  # normalization + clip + optimizer step done
    publish_end: float  # new weights acknowledged by the rollout engine (= barrier_end when nothing to publish)
    events: tuple[TraceEvent, ...]
    stats_bytes: int = 0  # peak gradient-statistics memory of the step
    peak_flops_per_s: float = 0.0  # device peak used for MFU (0: unknown)
    plan_bytes: int = 0  # the run's memory plan for its schedule, a prediction (`trl_thundersync.memory`; 0: none)
    peak_memory_bytes: int = 0  # measured: the process's peak resident set so far (GPU: peak allocated; 0: unknown)

    @property
    def wall(self) -> float:
        return self.publish_end - self.start
