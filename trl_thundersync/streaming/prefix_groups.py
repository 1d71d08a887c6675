"""The GRPO learner's shared-prefix state for one logical batch (`shared_prefix.py`, paper Appendix I): per group the
prompt is forwarded once at θ_k (`GroupPrefix`, plus `ReferencePrefix` for β·KL), each member's backward runs its
completion over the prefix's detached states (`TrajectoryBackward`), the members' boundary adjoints are folded with
the group's reward statistics (`PrefixAdjoints`), and when the group closes one backward through the prefix adds
J_pᵀ·(combined adjoint) into the batch accumulator's terms: the policy term per bucket, β·KL per bucket, the entropy
bonus per TRL micro-batch. Linear in the adjoints, so the batch direction is the full passes' up to FP32 rounding.

A group decides at its first member whether it gets a prefix: not when its prompt cannot be shared (`prompt_plan`)
or when `max_open` prefixes are held already; it then runs full passes, and so does a member whose tokens or prompt
length do not match its group's prefix (`PrefixMismatchError`). Each fallback is logged with its reason.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import PrefixMismatchError
from ..types import Rollout
from .accumulators import BatchAccumulator
from .gradient_sinks import FlatGradient, GradientSink
from .learner_records import PrefixShare, WorkItem
from .prefix_batch import RowsObjective, members_pass
from .segment_backward import ChannelObjective
from .shared_prefix import (
    GroupPrefix,
    MemberPass,
    PassWork,
    PrefixAdjoints,
    PrefixFallback,
    ReferencePrefix,
    context_window,
    prompt_plan,
)

logger = logging.getLogger(__name__)
_LOGGED: set[str] = set()  # run-level fallback reasons already logged by this process


def log_once(reason: str) -> None:
    """Log a run-level reason for full passes once per process."""
    if reason not in _LOGGED:
        _LOGGED.add(reason)
        logger.warning("shared_prefix: full passes: %s", reason)


@dataclass(frozen=True)
class TurnSeed:
    """What a turn-released member's history starts from: its group's prefix, forwarded once (`turn_seed`)."""

    ids: tuple[int, ...]  # the prefix tokens
    keys: list[torch.Tensor]  # policy keys per layer (1, kv_heads, P, head_dim), attached to the prefix's graph
    values: list[torch.Tensor]  # policy values per layer, likewise
    last_logits: torch.Tensor | None  # policy logits row at the prefix's last position (V,), graph-attached
    reference_keys: list[torch.Tensor] | None = None  # the KL reference's (no graph; None: β = 0)
    reference_values: list[torch.Tensor] | None = None
    reference_last: torch.Tensor | None = None


@dataclass
class _Open:
    prefix: GroupPrefix  # the policy's prefix pass, graph retained until the group closes
    reference: ReferencePrefix | None  # the KL reference's prefix key/values (β ≠ 0)
    adjoints: PrefixAdjoints  # the members' boundary adjoints, folded like the group statistics


class PrefixGroups:
    """The open shared prefixes of one logical batch; see the module docstring."""

    def __init__(self, *, model: Any, params: Sequence[torch.Tensor], group_size: int, max_open: int,
                 temperature: float = 1.0, device: torch.device | str = "cpu", reference: Any = None,
                 reference_context: Callable[[], contextlib.AbstractContextManager] | None = None,
                 flops: Callable[[PassWork], float] | None = None, min_prompt_tokens: int = 1) -> None:
        self.model, self.params, self.device = model, list(params), torch.device(device)
        self.min_prompt_tokens = min_prompt_tokens  # a shorter prompt does not repay its group's extra pass
        self.group_size, self.max_open, self.temperature = group_size, max_open, temperature
        self.reference, self.reference_context, self.flops = reference, reference_context, flops
        self.window = context_window(model)
        self.open: dict[int, _Open] = {}
        self.declined: dict[int, str] = {}  # group -> why its members run full passes
        self.mismatched: dict[int, str] = {}  # trajectory -> why it ran a full pass in a group with a prefix
        self.closed_work: list[PassWork] = []  # passes of the groups closed so far

    # -- group open --------------------------------------------------------------------------------------------
    def open_group(self, rollout: Rollout) -> tuple[int, float | None] | None:
        """Before a member's backward: `open_prompt` with its group and prompt."""
        return self.open_prompt(rollout.group, rollout.prompt_ids)

    def open_prompt(self, group: int, prompt_ids: Sequence[int]) -> tuple[int, float | None] | None:
        """Forward group `group`'s prefix (`prompt_ids`) if the group has none yet and can get one (before a
        member's backward, or its first turn's under turn release). Returns the prefix tokens forwarded and their
        FLOPs (policy and reference; None: no counter, or the group was decided before, or falls back)."""
        if group in self.open or group in self.declined:
            return None
        if len(prompt_ids) < self.min_prompt_tokens:
            return self._decline(group, f"its prompt of {len(prompt_ids)} tokens is shorter than "
                                        f"shared_prefix_min_prompt_tokens={self.min_prompt_tokens}")
        if len(self.open) >= self.max_open:
            return self._decline(group, f"{len(self.open)} open prefixes already (max_open_groups)")
        plan = prompt_plan(group, prompt_ids, self.window)
        if isinstance(plan, PrefixFallback):
            return self._decline(group, plan.reason)
        prefix = GroupPrefix(self.model, self.params, plan, self.device)
        reference = None
        if self.reference is not None:
            reference = ReferencePrefix(self.reference, plan, self.device, self.reference_context)
        self.open[group] = _Open(prefix, reference, PrefixAdjoints(group, self.group_size, prefix.adjoint_size))
        forwards = 1 + (reference is not None)
        return len(plan.ids), self._flops(PassWork(len(plan.ids), 0, 0), forwards)

    def open_item(self, group: int, prompt_ids: Sequence[int], ready: float, version: int) -> WorkItem | None:
        """`open_prompt` as the learner's "prefix_forward" work item (None: nothing was forwarded)."""
        start = time.perf_counter()
        opened = self.open_prompt(group, prompt_ids)
        if opened is None:
            return None
        return WorkItem("prefix_forward", -1, group, version, ready, start, time.perf_counter(), opened[0],
                        flops=opened[1])

    def _decline(self, group: int, reason: str) -> None:
        self.declined[group] = reason
        logger.info("shared_prefix: group %d runs full passes: %s", group, reason)
        return None

    # -- a member's pass ---------------------------------------------------------------------------------------
    def member(self, rollout: Rollout, objective: ChannelObjective,
               sinks: dict[str, GradientSink]) -> tuple[MemberPass, PrefixShare] | None:
        """Member `rollout`'s pass over its group's prefix (`GroupPrefix.member`); None: it runs its full pass (its
        group has no prefix, or its tokens do not extend the prefix as its prompt)."""
        state = self.open.get(rollout.group)
        if state is None:
            return None
        ids = [*rollout.prompt_ids, *rollout.completion_ids]
        before = (len(state.prefix.member_work), len(state.reference.member_work) if state.reference else 0)
        try:
            if len(rollout.prompt_ids) != state.prefix.plan.prompt_length:
                raise PrefixMismatchError(f"group {rollout.group} member {rollout.index}: a {len(rollout.prompt_ids)}"
                                          f"-token prompt where the group's is {state.prefix.plan.prompt_length}")
            result = state.prefix.member(rollout.index, ids, objective, sinks)
        except PrefixMismatchError as exc:
            self.mismatched[rollout.index] = str(exc)
            logger.info("shared_prefix: %s", exc)
            return None
        work = state.prefix.member_work[before[0]:]
        if state.reference is not None:
            work = work + state.reference.member_work[before[1]:]
        flops = sum(self.flops(w) for w in work) if self.flops is not None else None
        return result, PrefixShare(rollout.group, result.adjoints, flops)

    def fits(self, rollouts: Sequence[Rollout]) -> bool:
        """Whether these members of one group can share a padded pass over its prefix (`members`): the group has one,
        and each extends it as its prompt, past its end (otherwise each runs its own pass, which logs why)."""
        state = self.open.get(rollouts[0].group)
        if state is None:
            return False
        plan = state.prefix.plan
        return all(len(r.prompt_ids) == plan.prompt_length and r.group == plan.group
                   and len(ids) > len(plan.ids) and tuple(ids[: len(plan.ids)]) == plan.ids
                   for r, ids in ((r, [*r.prompt_ids, *r.completion_ids]) for r in rollouts))

    def members(self, rollouts: Sequence[Rollout], objective: RowsObjective,
                sinks: Mapping[Hashable, GradientSink]) -> tuple[dict[Hashable, torch.Tensor], float | None]:
        """Members of one group in one padded pass over its prefix (`prefix_batch.members_pass`; `fits` them first):
        their boundary adjoints per destination key and the pass's FLOPs (reference continuations included)."""
        if not self.fits(rollouts):
            raise PrefixMismatchError(f"group {rollouts[0].group}: members {[r.index for r in rollouts]} do not all "
                                      "extend its shared prefix; run them one by one")
        state = self.open[rollouts[0].group]
        rows = [[*r.prompt_ids, *r.completion_ids] for r in rollouts]
        before = len(state.reference.member_work) if state.reference is not None else 0
        ran = members_pass(state.prefix, [r.index for r in rollouts], rows, objective, sinks)
        work = [*ran.work, *(state.reference.member_work[before:] if state.reference is not None else [])]
        return ran.adjoints, (sum(self.flops(w) for w in work) if self.flops is not None else None)

    def add_batch(self, group: int, adjoints: Mapping[tuple[str, int], torch.Tensor],
                  rewards: Sequence[tuple[float, int]]) -> None:
        """A batched pass's adjoints (`members`), its members' coefficients already in them: summed per key, and
        propagated at the close as they are ("policy" into the policy term, unscaled); `rewards` (reward, bucket)
        per member enter the group's reward statistics without an adjoint of their own."""
        state = self.open.get(group)
        if state is None:
            return
        for (channel, key), adjoint in adjoints.items():
            state.adjoints.add_free(channel, adjoint, key)
        for reward, bucket in rewards:
            state.adjoints.add(reward, None, bucket)

    # -- turn release: a member's turns start from the prefix ---------------------------------------------------
    def turn_seed(self, index: int, context_ids: Sequence[int]) -> TurnSeed | None:
        """The prefix states trajectory `index`'s first turn starts from (its group's; None: the group has no prefix,
        or this context does not start with it, and the member runs its turns over its own history)."""
        group = index // self.group_size
        state = self.open.get(group)
        if state is None:
            return None
        ids = state.prefix.plan.ids
        if tuple(context_ids[: len(ids)]) != ids:
            self.mismatched[index] = (f"group {group} member {index}: its first turn's context does not start with "
                                      f"the group's {len(ids)}-token prefix")
            logger.info("shared_prefix: %s", self.mismatched[index])
            return None
        prefix, reference = state.prefix, state.reference
        last = prefix.logits[-1] if prefix.logits is not None else None
        if reference is None:
            return TurnSeed(ids, prefix.keys, prefix.values, last)
        ref_last = reference.rows[-1] if reference.rows is not None else None
        return TurnSeed(ids, prefix.keys, prefix.values, last, reference.keys, reference.values, ref_last)

    def turn_share(self, index: int, boundary: dict[str, list[torch.Tensor | None]],
                   scales: dict[str, float]) -> PrefixShare:
        """A turn-released member's boundary adjoints (`BoundaryCut.close`'s `boundary`, per channel: keys per layer,
        values per layer, last logits row) times the coefficient its channel's gradient gets at `finish`."""
        group = index // self.group_size
        prefix = self.open[group].prefix
        adjoints = {}
        for channel, pieces in boundary.items():
            pieces = pieces if prefix.logits is not None else pieces[:-1]
            flat = prefix.flatten(pieces, f"group {group} member {index} channel {channel!r}")
            adjoints[channel] = flat.mul_(scales[channel]) if scales[channel] != 1.0 else flat
        return PrefixShare(group, adjoints, None)

    def reference_logits(self, rollout: Rollout) -> torch.Tensor:
        """The KL reference's logits rows (|completion|, V) for a member of a group with a prefix."""
        state = self.open[rollout.group]
        return state.reference.logits(rollout.index, [*rollout.prompt_ids, *rollout.completion_ids])

    # -- adjoints (the learner calls these for every member of a group with a prefix) --------------------------
    def add(self, group: int, share: PrefixShare | None, reward: float, bucket: int, micro_batch: int) -> None:
        """A member whose reward is known (reward release): its score adjoint with its reward, the rest summed."""
        state = self.open.get(group)
        if state is None:
            return
        adjoints = share.adjoints if share is not None else {}
        self._add_free(state, adjoints, bucket, micro_batch)
        state.adjoints.add(reward, adjoints.get("score"), bucket)

    def hold(self, index: int, group: int, share: PrefixShare | None, bucket: int, micro_batch: int) -> None:
        """A member released at content: the advantage-free adjoints summed now, the score adjoint held."""
        state = self.open.get(group)
        if state is None:
            return
        adjoints = share.adjoints if share is not None else {}
        self._add_free(state, adjoints, bucket, micro_batch)
        state.adjoints.hold(index, adjoints.get("score"))

    def bind(self, index: int, group: int, reward: float, bucket: int) -> None:
        """A content-released member's reward (NaN: unscorable, its score adjoint is dropped with its H_i)."""
        state = self.open.get(group)
        if state is None:
            return
        if index in state.adjoints.held:
            state.adjoints.bind(index, reward, bucket)
        else:  # released before its group opened a prefix: a full pass, nothing held
            state.adjoints.add(reward, None, bucket)

    @staticmethod
    def _add_free(state: _Open, adjoints: dict[str, torch.Tensor], bucket: int, micro_batch: int) -> None:
        if "free" in adjoints:
            state.adjoints.add_free("free", adjoints["free"], bucket)
        if "entropy" in adjoints:
            state.adjoints.add_free("entropy", adjoints["entropy"], micro_batch)

    # -- group close -------------------------------------------------------------------------------------------
    def close(self, group: int, scale: float, accumulator: BatchAccumulator,
              entropy_terms: dict[int, torch.Tensor]) -> tuple[int, float | None] | None:
        """The group's coefficients are fixed: J_pᵀ·(folded adjoint) once per (channel, key) into the accumulator's
        policy (score, per bucket) and free (β·KL, per bucket) terms and the entropy micro-batch buffers. Returns
        the prefix tokens back-propagated and the FLOPs of those backward products (None: no prefix)."""
        state = self.open.pop(group, None)
        if state is None:
            return None
        folded = state.adjoints.fold(scale)
        sinks = {key: FlatGradient(self.params, accumulator.device) for key in folded}
        state.prefix.backward(folded, sinks)
        if state.reference is not None:
            self.closed_work.extend(state.reference.work)
        for (channel, key), sink in sinks.items():
            if channel in ("score", "policy"):  # "policy": a batched pass's, advantages in it already
                accumulator.add_policy({key: sink.vector})
            elif channel == "free":
                accumulator.add_free(sink.vector, key)
            elif key in entropy_terms:
                entropy_terms[key].add_(sink.vector)
            else:
                entropy_terms[key] = sink.vector
        self.closed_work.extend(state.prefix.work)
        tokens, backwards = len(state.prefix.plan.ids), state.prefix.prefix_backwards
        flops = None
        if self.flops is not None:  # the backward products only: the forward was priced at the group's open
            flops = self.flops(PassWork(tokens, 0, backwards)) - self.flops(PassWork(tokens, 0, 0))
        return tokens, flops

    def close_item(self, group: int, scale: float, accumulator: BatchAccumulator,
                   entropy_terms: dict[int, torch.Tensor], version: int) -> WorkItem | None:
        """`close` as the learner's "prefix_backward" work item (None: the group had no prefix)."""
        start = time.perf_counter()
        closed = self.close(group, scale, accumulator, entropy_terms)
        if closed is None:
            return None
        return WorkItem("prefix_backward", -1, group, version, start, start, time.perf_counter(), closed[0],
                        flops=closed[1])

    def _flops(self, work: PassWork, times: int = 1) -> float | None:
        return times * self.flops(work) if self.flops is not None else None

    def held_bytes(self) -> int:
        """What the open prefixes hold: retained prefix graphs, reference key/values, boundary adjoints."""
        return sum(s.prefix.held_bytes() + (s.reference.held_bytes() if s.reference is not None else 0)
                   + s.adjoints.nbytes() for s in self.open.values())

    def discard(self) -> None:
        """Free every open prefix (a void batch)."""
        for state in self.open.values():
            state.prefix.discard()
        self.open.clear()
