"""When reward functions are called, and on which trajectories: `reward_scope` (TRL semantics, streaming where exact).

`trl.GRPOTrainer` calls every reward function once per generation batch, so a function may legally depend on the
other completions of its call (rank within the group, length relative to the batch mean, a pairwise judge). Calling
it one trajectory at a time computes a different objective. `RewardStage` sits between the rollout engine and the
learner and releases scored trajectories as soon as their scope is complete:

- `"trajectory"`: each function called with one completion the moment that trajectory ends (exact only for
  per-sample functions; the earliest release);
- `"group"`:      once per GRPO group, with the group's rows in batch order, when its last trajectory ends (exact for
  group-relative rewards); the group's trajectories are released together;
- `"batch"`:      once with the whole generation batch in TRL's row order — the very call `trl.GRPOTrainer` makes.
  Learner work waits for that call, so until release at content readiness exists this scope has little overlap;
- `"auto"`:       `"trajectory"`, guarded by `ScopeProbe`: when the run's first group closes, every plain reward
  function (not reward models, not an environment's `get_reward`) is called once more on the whole group; if the
  values differ from its per-trajectory ones, `RewardScopeError` stops training before the first optimizer step.

The accumulators are exact for any arrival order, so the scope changes only *when* learner work is released.

Environment rewards (the `get_reward` wrappers TRL appends after the user's functions) are per episode in every
scope. With `grading_workers` > 1 they are graded ahead, on a `GradingPool`, from the moment each trajectory is
delivered (`start`); the trajectory's, group's or batch's call then takes those values (`grading.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import get_args

import torch

from ..errors import RewardScopeError
from ..types import RewardScope, Rollout, ScoredRollout
from .grading import GradingPool
from .rewards import RewardContext, RewardScorer, ScoringInput, describe_call

REWARD_SCOPES: tuple[RewardScope, ...] = get_args(RewardScope)

# Probe tolerance, relative to the largest |reward| of the group (at least 1). Rewards are float32 from here on
# (TRL converts them too), and a per-sample function evaluated vectorized over a group may legitimately differ from
# its one-row value by a few float32 ULPs (2^-24 ≈ 6e-8 relative each); 1e-6 is ~16 ULPs. A reward that really reads
# its neighbours differs by a sizeable fraction of its scale (rank, mean-centering, normalization), far above this.
PROBE_RTOL = 1e-6


def _no_log_extra(column: str, rows: Sequence[int], values: list) -> None:  # the probe's extra call must not log twice
    pass


def _no_log_metric(name: str, value: float) -> None:
    pass


class ScopeProbe:
    """The `"auto"` guard: compares each probed function's per-trajectory values with one call on the first group.

    Lives as long as the trainer (the probe runs once per run). `probed` are the indices of plain reward functions.
    """

    def __init__(self, probed: Sequence[int]) -> None:
        self.probed = tuple(probed)
        self.done = not self.probed

    def check(self, scorer: RewardScorer, items: Sequence[ScoringInput], scored: Sequence[ScoredRollout],
              context: RewardContext) -> None:
        if self.done:
            return
        self.done = True
        quiet = RewardContext(context.trainer_state, _no_log_extra, _no_log_metric)
        for i in self.probed:
            together = scorer.values(i, items, quiet)
            alone = [s.rewards_per_func[i] for s in scored]
            if not values_agree(alone, together):
                name = scorer.names[i]
                raise RewardScopeError(
                    f"reward function '{name}' depends on the other completions of its call: on "
                    f"{describe_call(items)} it gave {_short(alone)} called once per trajectory but {_short(together)} "
                    f"called once on the group. reward_scope='auto' (the default) calls reward functions one "
                    f"trajectory at a time, which would train a different objective than trl.GRPOTrainer. Set "
                    f"reward_scope='group' (for group-relative rewards) or reward_scope='batch' (for batch-relative "
                    f"rewards: trl.GRPOTrainer's exact call), or reward_scope='trajectory' if '{name}' is a "
                    f"non-deterministic judge whose values merely vary from call to call"
                )


def values_agree(a: Sequence[float], b: Sequence[float], rtol: float = PROBE_RTOL) -> bool:
    """Equal up to `rtol` × the larger of 1 and the largest |value|; NaN (None) equals only NaN."""
    finite = [abs(v) for v in (*a, *b) if not math.isnan(v)]
    tol = rtol * max([1.0, *finite])
    for x, y in zip(a, b, strict=True):
        if math.isnan(x) or math.isnan(y):
            if not (math.isnan(x) and math.isnan(y)):
                return False
        elif abs(x - y) > tol:
            return False
    return True


def _short(values: Sequence[float]) -> str:
    return "[" + ", ".join("None" if math.isnan(v) else f"{v:.6g}" for v in values) + "]"


class RewardStage:
    """Scores one logical batch's trajectories per `scope` and releases them as their scope completes.

    `add(rollout)` is called in arrival order (from one scoring thread) and returns the trajectories it releases —
    none while a group or the batch is still incomplete. `prepare` turns a rollout into its `ScoringInput`
    (decoded completion, prompt, dataset row, environment). With `grading_workers` > 1 and `environment_rewards`
    (indices of the scorer's environment `get_reward` wrappers), `start(rollout)` — called from the delivering thread
    as soon as the trajectory is delivered, before its `add` — grades its environment on the pool, and `add` waits
    for the grades of its call's rows before calling the user's functions. `close()` ends the pool (always call it).
    """

    def __init__(self, scorer: RewardScorer, scope: str, *, batch_size: int, num_generations: int,
                 prepare: Callable[[Rollout], ScoringInput], context: RewardContext,
                 probe: ScopeProbe | None = None, environment_rewards: Sequence[int] = (),
                 grading_workers: int = 1) -> None:
        if scope not in REWARD_SCOPES:
            raise ValueError(f"reward_scope={scope!r} is not one of {REWARD_SCOPES}")
        self.scorer = scorer
        self.scope = scope
        self.batch_size = batch_size
        self.num_generations = num_generations
        self.prepare = prepare
        self.context = context
        self.probe = probe if scope == "auto" else None
        self._waiting: dict[int, list[ScoringInput]] = {}  # group (or -1 for the batch) -> its arrived members
        self._scored: dict[int, list[tuple[ScoringInput, ScoredRollout]]] = {}  # "auto": members scored so far
        self._grading = (GradingPool(scorer, environment_rewards, grading_workers, context)
                         if grading_workers > 1 and environment_rewards else None)
        self._started: dict[int, ScoringInput] = {}  # delivered and being graded, not yet added

    @property
    def grades_ahead(self) -> bool:
        """Whether `start` grades environments concurrently (else it need not be called)."""
        return self._grading is not None

    def start(self, rollout: Rollout) -> None:
        if self._grading is None:
            return
        item = self.prepare(rollout)
        self._started[rollout.index] = item
        self._grading.start(item)

    def close(self) -> None:
        if self._grading is not None:
            self._grading.close()

    def add(self, rollout: Rollout) -> list[ScoredRollout]:
        item = self._started.pop(rollout.index, None)
        if item is None:
            item = self.prepare(rollout)
            if self._grading is not None:  # not started at delivery: grade it now
                self._grading.start(item)
        if self.scope in ("trajectory", "auto"):
            scored = self._score([item])
            if self.probe is not None and not self.probe.done:
                self._probe_when_group_closes(item, scored[0])
            return scored
        key = rollout.group if self.scope == "group" else -1
        members = self._waiting.setdefault(key, [])
        members.append(item)
        if len(members) < (self.num_generations if self.scope == "group" else self.batch_size):
            return []
        del self._waiting[key]
        return self._score(sorted(members, key=lambda x: x.rollout.index))

    def _score(self, items: list[ScoringInput]) -> list[ScoredRollout]:
        """One reward call on `items`; environment rewards graded ahead are waited for first, then taken as they are."""
        if self._grading is None:
            return self.scorer.score(items, self.context)
        grades = [self._grading.result(x.rollout.index) for x in items]
        return self.scorer.score(items, self.context, {i: [g[i] for g in grades] for i in self._grading.funcs})

    def _probe_when_group_closes(self, item: ScoringInput, scored: ScoredRollout) -> None:
        members = self._scored.setdefault(item.rollout.group, [])
        members.append((item, scored))
        if len(members) == self.num_generations:
            del self._scored[item.rollout.group]
            members.sort(key=lambda m: m[0].rollout.index)
            self.probe.check(self.scorer, [m[0] for m in members], [m[1] for m in members], self.context)


def plain_reward_functions(funcs: Sequence[object], num_user_funcs: int) -> list[int]:
    """Indices the `"auto"` probe checks: the user's callables. Reward models are per-sample by construction (one
    forward per text) and the `get_reward` wrappers TRL appends after the user's functions score each episode alone."""
    return [i for i, f in enumerate(funcs[:num_user_funcs]) if not isinstance(f, torch.nn.Module)]
