"""Synthetic multi-turn trajectories as `TurnEvent`s, and a deterministic fake teacher, for tests and benchmarks.

A trajectory is prompt → action_0 → framing_0 → action_1 → …; turn j's context is everything before action_j.
Framing lengths of 0 (an action that directly follows the previous one) and empty actions are allowed, so the
edge cases of the boundary-cut backward are reachable.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..distill.losses import action_logprobs
from ..distill.records import TeacherScores
from ..types import TurnEvent


def synthetic_trajectory(index: int, vocab: int, *, prompt: int, actions: Sequence[int], framings: Sequence[int],
                         seed: int, policy_version: int = 0) -> list[TurnEvent]:
    """Turn events of one trajectory with random token ids; `framings[j]` tokens follow action j."""
    g = torch.Generator().manual_seed(seed)

    def draw(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(0, vocab, (n,), generator=g).tolist())

    context = draw(prompt)
    events = []
    for turn, n in enumerate(actions):
        action = draw(n)
        events.append(TurnEvent(index, turn, policy_version, context, action, 0.0))
        context = context + action + draw(framings[turn] if turn < len(framings) else 0)
    return events


class SeededTeacher:
    """A fake full-vocabulary teacher: logits are a fixed function of (context length, token) — deterministic, no
    model — so every test sees identical scores whatever the arrival order."""

    full_vocabulary = True

    def __init__(self, vocab: int, seed: int = 0, scale: float = 2.0) -> None:
        self.table = torch.randn(4096, vocab, generator=torch.Generator().manual_seed(seed)) * scale

    def score(self, context_ids: Sequence[int], action_ids: Sequence[int]) -> TeacherScores:
        rows = [(len(context_ids) + t + 31 * (list(context_ids) + list(action_ids))[len(context_ids) + t - 1]) % 4096
                for t in range(len(action_ids))]
        logits = self.table[rows] if rows else torch.zeros(0, self.table.shape[1])
        return TeacherScores(action_logprobs(logits, torch.tensor(list(action_ids), dtype=torch.long)), logits)

    def close(self) -> None:
        return None
