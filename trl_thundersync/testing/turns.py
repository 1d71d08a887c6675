"""Synthetic multi-turn trajectories as `TurnEvent`s, a deterministic fake teacher and a replaying multi-turn engine,
for tests and benchmarks.

A trajectory is prompt → action_0 → framing_0 → action_1 → …; turn j's context is everything before action_j.
Framing lengths of 0 (an action that directly follows the previous one) and empty actions are allowed, so the
edge cases of the boundary-cut backward are reachable.
"""

from __future__ import annotations

import time
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


class ReplayTurnEngine:
    """A multi-turn `RolloutEngine` that replays fixed trajectories: turn events go out through `on_turn` in a
    seeded random interleaving across trajectories (each trajectory's turns stay in order, as in a real agent loop),
    and each trajectory is yielded by `results()` right after its last turn. Publication only bumps the version."""

    def __init__(self, trajectories: Sequence[Sequence[TurnEvent]], on_turn, order_seed: int = 0,
                 policy_version: int = 0) -> None:
        self.trajectories = [list(t) for t in trajectories]
        self.on_turn = on_turn
        self.order_seed = order_seed
        self.policy_version = policy_version
        self.publications: list[int] = []

    def start_batch(self, requests, policy_version: int) -> None:
        self.batch_version = policy_version

    def results(self):
        from ..types import AgentStats, Rollout

        g = torch.Generator().manual_seed(self.order_seed)
        cursor = [0] * len(self.trajectories)
        live = [i for i, t in enumerate(self.trajectories) if t]
        while live:
            i = live[int(torch.randint(0, len(live), (1,), generator=g))]
            events = self.trajectories[i]
            event = events[cursor[i]]
            self.on_turn(TurnEvent(event.index, event.turn, self.batch_version, event.context_ids, event.action_ids,
                                   time.perf_counter(), event.action_logprobs))
            cursor[i] += 1
            if cursor[i] == len(events):
                live.remove(i)
                last = events[-1]
                full = last.context_ids + last.action_ids
                prompt = events[0].context_ids
                stats = AgentStats(len(events), 0, 0, 0, 0, (), (), 0.0, "answered")
                yield Rollout(index=last.index, group=last.index, policy_version=self.batch_version,
                              prompt_ids=prompt, completion_ids=full[len(prompt):], agent=stats)

    def publish(self, model, policy_version: int) -> float:
        self.policy_version = policy_version
        self.publications.append(policy_version)
        return 0.0

    def close(self) -> None:
        return None
