"""The streamed distillation barrier across learner processes (DDP): one exchange per logical batch.

Each process streams its own share of the logical batch (its micro-batches, as TRL's `GKDTrainer` does per process)
and ends with Σ_j g_j over its turns and its scored-token count. The batch direction is token-normalized over the
whole global batch, as TRL normalizes its distillation loss by the global valid-token count (`DistillationTrainer`
gathers `loss_mask.sum()` into `num_items_in_batch`; `GKDTrainer.generalized_jsd_loss(..., num_items_in_batch)`):

    N_k = Σ_ranks N_r          direction = Σ_ranks Σ_{j ∈ r} g_j / N_k

With `on_policy_normalizer="num_items_in_batch"` (stock `GKDTrainer`'s, the default for the generalized JSD) N_k is
transformers' count of the window's dataset label tokens instead (`distill.normalizer`); every share carries it.

The placement's `hand_over` takes this process's share with the direction being the MEAN over processes (DDP's
convention), so each process hands over `world · Σ_{j ∈ r} g_j / N_k` (`local_share`).

Lifecycle, on every process, in the same order, once per streamed batch:

1. the process streams its share; a failure (teacher, rollout, learner) is caught, not raised yet (`failed_share`);
2. `gather` (one collective: `accelerate.utils.gather_object`) exchanges every process's `RankShare` — it runs on
   every process, with zero tokens or a failure too, so no process waits for one that will not come;
3. `check_shares`: a process that failed re-raises its own error; the others raise `PeerProcessError` naming the
   failed rank and its cause; then `normalizer.step_normalizer` on every share: zero scored tokens (or a zero
   `num_items_in_batch`) → `NoScoredTokensError` on every process, never a one-sided refusal;
4. the trainer hands `local_share(...)` to the placement (the direction's all-reduce) and logs `batch_metrics`, the
   same values on every process: what one process streaming the whole global batch would log (the timing metrics
   are the slowest process's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..envs.harness.metrics import agent_metrics
from ..errors import PeerProcessError
from ..streaming.learner_records import TeacherLoad
from ..types import AgentStats
from .records import DistillTotals


@dataclass(frozen=True)
class RankShare:
    """What one learner process contributes to the barrier of a streamed batch (small: pickled and gathered)."""

    rank: int  # the process's index (accelerate's `process_index`)
    failure: str | None  # "Type: message" when the process's share raised before the barrier; None when it finished
    scored_tokens: int  # N_r: scored action tokens of this process's turns
    loss_sum: float  # Σ per-token loss values over those tokens (OPD: −A; GJSD: the divergence)
    turns: int  # turns the process's learner processed
    peak_open: int  # most trajectories open at once in this process's learner
    teacher_wait: float  # Σ over its turns: action complete → teacher starts scoring (seconds)
    teacher: TeacherLoad  # its teacher's requests, prefill tokens and busy seconds (and each schedule's prefill)
    timing: tuple[tuple[str, float], ...]  # this process's `step_timing_metrics` (name, seconds or fraction)
    completion_lengths: tuple[int, ...]  # model tokens of each of its trajectories (tool tokens excluded)
    agents: tuple[AgentStats, ...]  # per-trajectory agent statistics (empty without tools / environments)
    engine: tuple[tuple[str, float], ...]  # this process's rollout engine metrics (e.g. the servers' `rollout/...`)
    num_items: float | None = None  # the `num_items_in_batch` transformers handed this process's window (None: none)


def finished_share(rank: int, totals: DistillTotals, timing: dict[str, float], completion_lengths: Sequence[int],
                   agents: Sequence[AgentStats], engine: dict[str, float], teacher_wait: float,
                   teacher: TeacherLoad, num_items: float | None = None) -> RankShare:
    """The share of a process whose batch reached the barrier."""
    return RankShare(rank, None, totals.scored_tokens, totals.loss_sum, totals.turns, totals.peak_open_trajectories,
                     teacher_wait, teacher, tuple(timing.items()), tuple(completion_lengths), tuple(agents),
                     tuple(engine.items()), num_items)


def failed_share(rank: int, error: BaseException) -> RankShare:
    """The share of a process whose batch raised: it still enters the exchange, carrying its cause."""
    return RankShare(rank, f"{type(error).__name__}: {error}", 0, 0.0, 0, 0, 0.0, TeacherLoad(), (), (), (), ())


def check_shares(shares: Sequence[RankShare], rank: int, own_error: BaseException | None) -> int:
    """After the exchange: raise on every process when any failed (own error first), else return N_k (Σ N_r)."""
    if own_error is not None:
        raise own_error
    failed = [s for s in shares if s.failure is not None]
    if failed:
        first = failed[0]
        raise PeerProcessError(
            f"learner process {first.rank} of {len(shares)} failed its share of the streamed batch, so process "
            f"{rank} refuses the step too (the batch direction needs every process's turns): {first.failure}")
    return sum(s.scored_tokens for s in shares)


def local_share(grads: Sequence[torch.Tensor], scale: float) -> torch.Tensor:
    """This process's flat share scale · Σ_{j ∈ r} g_j (FP32), whose mean over processes is the batch direction
    (`distill.normalizer.StepNormalizer.share_scale`: world / N for a count shared by every process)."""
    return torch.cat([g.reshape(-1).to(torch.float32) * scale for g in grads])


def global_loss(shares: Sequence[RankShare]) -> float:
    """Σ loss / N_k over the global batch: the loss one process streaming the whole batch reports."""
    return sum(s.loss_sum for s in shares) / sum(s.scored_tokens for s in shares)


def batch_metrics(shares: Sequence[RankShare], objective: str) -> dict[str, float]:
    """The trainer's per-batch metrics over the global batch, identical on every process.

    Counts are summed over processes (scored tokens, turns, teacher requests and prefill); the teacher's seconds per
    turn are its busy time over all turns / all turns;
    the mean completion length, `opd/reverse_kl` and the agent metrics are computed over every trajectory of the
    global batch; `open_trajectories_peak` and the timing metrics are the largest over processes (each process has
    its own learner, and the barrier waits for the slowest); engine metrics are averaged over the processes that
    report them."""
    turns = sum(s.turns for s in shares)
    lengths = [n for s in shares for n in s.completion_lengths]
    out = {
        "thundersync/on_policy": 1.0,
        "thundersync/scored_tokens": float(sum(s.scored_tokens for s in shares)),
        "thundersync/turns": float(turns),
        "thundersync/open_trajectories_peak": float(max(s.peak_open for s in shares)),
        "thundersync/teacher_queue_wait_seconds": sum(s.teacher_wait for s in shares) / max(turns, 1),
        "thundersync/teacher_scoring_seconds": sum(s.teacher.busy_seconds for s in shares) / max(turns, 1),
        "thundersync/teacher_busy_seconds": sum(s.teacher.busy_seconds for s in shares),
    }
    for name in TeacherLoad().metrics():  # counts: summed over processes
        out[name] = sum(s.teacher.metrics()[name] for s in shares)
    for name in dict(shares[0].timing):
        out[name] = max(dict(s.timing)[name] for s in shares)
    if objective == "opd":  # −Σ A / N = mean of log π_θ − log π_T over sampled tokens
        out["opd/reverse_kl"] = global_loss(shares)
    out["completions/mean_length"] = sum(lengths) / max(len(lengths), 1)
    out.update(agent_metrics([a for s in shares for a in s.agents]))
    reported: dict[str, list[float]] = {}
    for s in shares:
        for name, value in s.engine:
            reported.setdefault(name, []).append(value)
    out.update({name: sum(values) / len(values) for name, values in reported.items()})
    return out
