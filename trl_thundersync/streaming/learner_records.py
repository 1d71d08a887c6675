"""Records of the learners: one unit of learner work (`WorkItem`, GRPO's and distillation's alike, the latter with its
teacher lane as an extra) and the wall-clock landmarks of one logical batch (`BatchTiming`, with the distillation
teacher's load as an extra); and the GRPO learner's own: what a source's backward produced, the batch totals (frozen),
and the per-row tallies it fills on the way (its running state)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from .accumulators import BatchAccumulator
from .advantages import RewardScaling
from .moe_aux import RouterAuxResult
from .sampling_difference import SamplingStats


@dataclass(frozen=True)
class PrefixShare:
    """A member's backward that ran over its group's shared prefix: what the learner folds at the group's close
    (`prefix_groups.py`)."""

    group: int  # the member's group
    adjoints: dict[str, torch.Tensor]  # channel ("score", "free", "entropy") -> flat FP32 boundary adjoint
    flops: float | None  # learner FLOPs of the continuation passes it ran (`pass_flops`; None: no counter)


@dataclass(frozen=True)
class SourceGradients:
    """What one trajectory's backward produced at θ_k."""

    score_grad: torch.Tensor | None  # H_i = ∇ Σ_t m_it u_i log π(o_it), FP32 (P,); None for unscorable rows
    free_grad: torch.Tensor | None  # K_i: gradient of advantage-free terms (β·KL), FP32 (P,); None if none
    scored_tokens: int  # Σ_t m_it: tokens that count in loss normalizers
    free_value: float = 0.0  # value of the advantage-free loss term (Σ_t m_it u_i β KL_it), for logging
    kl_sum: float = 0.0  # Σ_t m_it KL_it (unweighted), for the `kl` metric
    entropy_grad: torch.Tensor | None = None  # E_i = ∇ Σ_t m_it (−coef) H_it, FP32 (P,); None without the bonus
    entropy_sum: float = 0.0  # Σ_t m_it H_it (the entropy bonus's value before its normalizer)
    off_policy_kl: float = 0.0  # TRL's off-policy mask statistic: masked mean of (sampler − current) log-probs
    # V_i = Σ_t m_it u_i g c_it h_it: the policy loss value per unit of −A_i at ratio 1 (`source.py`; sapo's 2/τ_± at
    # the barrier); None: not computed (the barrier then takes Σ_t m_it u_i, TRL's value for grpo-like losses)
    policy_value: float | None = None
    # how far the sampler's log-probs are from θ_k's on its loss tokens (`sampling_difference`); None: the rollout
    # carries no sampler log-probs
    sampling: SamplingStats | None = None
    # the member's pass ran over its group's shared prefix: its boundary adjoints, folded at the group's close
    # (`prefix_groups.py`); None: a full pass
    prefix: PrefixShare | None = None


@dataclass(frozen=True)
class GroupBatch:
    """What the padded pass of several members of one group over its shared prefix produced (`prefix_batch.py`),
    their advantages already folded in."""

    rows: tuple[SourceGradients, ...]  # per member, in the order given: its scalars (no gradient vectors)
    vectors: dict[tuple[str, int], torch.Tensor]  # ("policy" | "free", bucket) or ("entropy", micro-batch) -> FP32
    adjoints: dict[tuple[str, int], torch.Tensor]  # the same keys -> their boundary adjoint (for the prefix's close)
    flops: float | None  # learner FLOPs of the passes (`pass_flops`, padding included; None: no counter, or full
    # sequences, which the trace prices by each member's tokens as it prices full passes)
    ran: tuple[tuple[int, ...], ...]  # the trajectories each pass ran (members with nothing to learn: none)


# What one learner item did. GRPO: "trajectory" (backward at reward release), "content" (backward before the reward),
# "turn" (one turn's backward), "close" (a turn-released trajectory's deferred adjoints and final scalars), "bind" (a
# buffered H_i folded into its group once the reward is known), "group_fold", "router_aux" (the MoE load-balancing term
# of one TRL micro-batch, once its last member's tokens are final), "prefix_forward" / "prefix_backward" (a group's
# shared prompt forwarded once / back-propagated once with its members' folded adjoints). Distillation:
# "turn_backward" (one turn's objective backward), "context_replay" (a closed trajectory's deferred context adjoints).
# `trace.recorder.LEARNER_KINDS` maps GRPO's names to the trace's.
WorkKind = Literal["trajectory", "content", "turn", "close", "bind", "group_fold", "router_aux", "prefix_forward",
                   "prefix_backward", "turn_backward", "context_replay"]


@dataclass(frozen=True)
class TeacherInterval:
    """The teacher lane of a distillation learner item: how its turn waited for, and was scored by, the teacher."""

    queued: float  # perf_counter when the turn's action was complete (it waits for the teacher from here)
    start: float  # when the teacher request that scored it started
    end: float  # when its scores were known (the item's ready time τ); one request can score several turns of a
    # trajectory (teacher_scoring="trajectory"): those items carry the same (start, end)

    @property
    def wait(self) -> float:
        """Seconds the turn waited for the teacher after its action was complete."""
        return self.start - self.queued

    @property
    def seconds(self) -> float:
        """Seconds of the teacher request that scored it (shared by the turns one request scored)."""
        return self.end - self.start


@dataclass(frozen=True)
class WorkItem:
    """One unit of learner work, for the trace and the scheduling model (paper Eq. 1)."""

    kind: WorkKind
    index: int  # trajectory index in the batch, or -1 for a group fold or a micro-batch term
    group: int  # GRPO group (-1: a micro-batch term, or distillation, which has no groups)
    policy_version: int
    ready: float  # τ: when its inputs were fixed (reward known / content fixed / turn complete / last member folded /
    # teacher scores known / trajectory closed)
    start: float  # service start (perf_counter)
    end: float  # service end (perf_counter)
    tokens: int  # scored tokens (0 for folds and binds; context tokens replayed for a "context_replay")
    content_ready: float | None = None  # trajectory items: when its last turn ended (tokens fixed)
    reward_at: float | None = None  # trajectory items: when its reward became known (None: never / not yet)
    turn: int = -1  # "turn" / "turn_backward" items: the turn number (the first, when several were coalesced)
    turns: int = 1  # "turn" items: the consecutive turns learned as one segment (>1: coalesced, `coalesce.py`)
    # "trajectory" items: the rows of the padded pass of its group's members it ran in (`source_batch.py`; its start/end
    # and FLOPs are its share of the group's passes, by forwarded tokens); 0: in a group batch, but nothing to learn
    # (not forwarded); 1: its own pass
    batched: int = 1
    teacher: TeacherInterval | None = None  # "turn_backward" items: the teacher scoring its turn (None: no teacher)
    flops: float | None = None  # learner FLOPs the learner priced itself (shared-prefix passes, `pass_flops`); None:
    # the trace prices the item by its tokens


@dataclass(frozen=True)
class TeacherLoad:
    """What the teacher did in one logical distillation batch, and what each schedule would prefill for the same turns
    (`distill.teacher_schedule`)."""

    requests: int = 0  # teacher forwards (HTTP requests to a teacher server)
    prefill_tokens: int = 0  # tokens those forwards read (the prefill the teacher paid)
    busy_seconds: float = 0.0  # Σ over requests of their wall time
    turn_schedule_tokens: int = 0  # prefill of one request per turn: Σ_j |c_j| + |a_j|
    trajectory_schedule_tokens: int = 0  # prefill of the fewest covering requests per trajectory

    def metrics(self) -> dict[str, float]:
        return {
            "thundersync/teacher_requests": float(self.requests),
            "thundersync/teacher_prefill_tokens": float(self.prefill_tokens),
            "thundersync/teacher_prefill_tokens_turn_schedule": float(self.turn_schedule_tokens),
            "thundersync/teacher_prefill_tokens_trajectory_schedule": float(self.trajectory_schedule_tokens),
        }


@dataclass(frozen=True)
class BatchTiming:
    """Wall-clock landmarks of one logical batch (perf_counter seconds), GRPO's or distillation's."""

    start: float  # requests admitted
    rollout_end: float  # R: the rollout batch closed (GRPO: the last trajectory scored; distillation: the last
    # trajectory finished and its last turn scored)
    learner_busy: float  # Σ service time of learner work items (L)
    barrier: float  # every learner item done
    arrival_order: tuple[int, ...] = ()  # GRPO: trajectory indices in the order they were scored (distillation: ())
    teacher_wait: float = 0.0  # distillation: Σ over turns of `TeacherInterval.wait` (0 without a teacher)
    teacher: TeacherLoad | None = None  # distillation: the teacher's requests, prefill and busy time (None: GRPO)
    turns_released: bool | None = None  # GRPO, release="turn": this step learned turns as they ended (False: it ran as
    # "content", `release.step_release`); None otherwise
    learner_cpu: float | None = None  # CPU seconds of the learner's thread (the one that drains the batch and runs its
    # passes) from admission to the barrier; on CPU training, learner_busy − learner_cpu is time it waited for a core

    @property
    def tail(self) -> float:
        """Learner time after the rollout batch closed."""
        return max(0.0, self.barrier - self.rollout_end)

    @property
    def teacher_seconds(self) -> float:
        """Σ over teacher requests of their wall time (0 without a teacher)."""
        return self.teacher.busy_seconds if self.teacher is not None else 0.0


@dataclass(frozen=True)
class BatchTotals:
    """Everything the barrier needs, fixed once every trajectory and group of the batch has closed."""

    accumulator: BatchAccumulator
    rewards: tuple[float, ...]  # per trajectory index, NaN for unscorable
    group_means: tuple[float, ...]
    group_stds: tuple[float, ...]
    scored_tokens: tuple[int, ...]  # per trajectory index
    free_values: tuple[float, ...]  # per trajectory index: SourceGradients.free_value
    kl_sums: tuple[float, ...]  # per trajectory index: SourceGradients.kl_sum
    work: tuple[WorkItem, ...]
    peak_stats_bytes: int  # high-water mark of group statistics + batch buffers (+ release buffers, per-turn state)
    scaling: RewardScaling  # the `scale_rewards` rule the groups were folded with (the barrier applies the rest)
    peak_held: int = 0  # most trajectories holding a release buffer or per-turn state at once
    turn_fallbacks: int = 0  # turn-released trajectories recomputed whole (their turns did not match their tokens)
    # high-water mark of the open shared prefixes (`prefix_groups`): retained prefix graphs, reference key/values and
    # boundary adjoints, at most max_open_groups of them (0: no shared prefix)
    peak_prefix_bytes: int = 0
    router_aux: RouterAuxResult | None = None  # the MoE router auxiliary term (None: TRL adds none)
    entropy_terms: dict[int, torch.Tensor] | None = None  # Σ_{i∈b} E_i per TRL micro-batch b (None: no bonus)
    entropy_sums: tuple[float, ...] = ()  # per trajectory index: SourceGradients.entropy_sum
    objective_rewards: tuple[float, ...] | None = None  # normalize_then_sum: TRL's group-normalized R_i per index
    deferred: tuple[tuple[int, int, torch.Tensor], ...] = ()  # (index, bucket, H_i) masked rows decided at the barrier
    off_policy_dropped: tuple[int, ...] = ()  # rows whose policy term the off-policy mask dropped (so far)
    policy_values: tuple[float | None, ...] = ()  # per trajectory index: SourceGradients.policy_value
    sampling: tuple[SamplingStats | None, ...] = ()  # per trajectory index: SourceGradients.sampling


@dataclass
class TrajectoryTallies:
    """Per-row values of one batch for the barrier (batch-row order), filled as each trajectory's backward runs.

    Mutable on purpose: the learner's own running state, frozen into `BatchTotals` tuples at the barrier."""

    rewards: list[float]  # R_i, NaN until scored (and for unscorable rows)
    tokens: list[int]  # SourceGradients.scored_tokens
    free_values: list[float]  # SourceGradients.free_value
    kl_sums: list[float]  # SourceGradients.kl_sum
    entropy_sums: list[float]  # SourceGradients.entropy_sum
    policy_values: list[float | None]  # SourceGradients.policy_value
    objective_rewards: list[float]  # normalize_then_sum: TRL's group-normalized R_i, NaN until its group closes
    sampling: list[SamplingStats | None]  # SourceGradients.sampling

    @classmethod
    def empty(cls, batch_size: int) -> TrajectoryTallies:
        return cls(rewards=[math.nan] * batch_size, tokens=[0] * batch_size, free_values=[0.0] * batch_size,
                   kl_sums=[0.0] * batch_size, entropy_sums=[0.0] * batch_size, policy_values=[None] * batch_size,
                   objective_rewards=[math.nan] * batch_size, sampling=[None] * batch_size)

    def frozen(self, objectives: bool) -> dict:
        """The per-row `BatchTotals` fields, as tuples (`objective_rewards` only under normalize_then_sum)."""
        return dict(rewards=tuple(self.rewards), scored_tokens=tuple(self.tokens), free_values=tuple(self.free_values),
                    kl_sums=tuple(self.kl_sums), entropy_sums=tuple(self.entropy_sums),
                    objective_rewards=tuple(self.objective_rewards) if objectives else None,
                    policy_values=tuple(self.policy_values), sampling=tuple(self.sampling))

    def record(self, index: int, grads: SourceGradients) -> None:
        """Keep the scalars of row `index`'s backward."""
        self.tokens[index] = grads.scored_tokens
        self.free_values[index] = grads.free_value
        self.kl_sums[index] = grads.kl_sum
        self.entropy_sums[index] = grads.entropy_sum
        self.policy_values[index] = grads.policy_value
        self.sampling[index] = grads.sampling
