"""When the teacher scores, and how much it prefills: one request per turn, or one per trajectory.

Scoring a turn means one teacher forward over everything the action was conditioned on plus the action
(`prompt_logprobs`). vLLM computes prompt log-probabilities only for tokens it prefills, and a request that asks
for them is never served from the prefix cache, so every request pays its whole length. For a trajectory whose turn
j has context c_j and action a_j (with a prefix-preserving chat template, c_{j+1} = c_j + a_j + observation_j):

    per turn          J requests, prefill Σ_j (|c_j| + |a_j|)      — quadratic in the number of turns
    per trajectory    1 request over c_J + a_J, prefill |c_J| + |a_J|  — linear; turn j's log-probs are the
                      positions [|c_j|, |c_j| + |a_j|) of that one answer (causal attention: the same numbers)

The price of the second: a turn's scores (so its student backward, the OPD release point) wait until its trajectory
finished, instead of being known while the next tool runs. `teacher_scoring="turn"` keeps the earliest release;
`"trajectory"` is the cheaper schedule when the teacher is the bottleneck (long multi-turn contexts, a shared teacher
server); the step's metrics carry the prefill of both schedules for the same turns (`TeacherLoad`), so the choice
can be read off a run.

A trajectory's turns are covered by as few requests as their token sequences allow: each turn is scored in the
request of the longest sequence it is a prefix of; a turn whose context is not a prefix of a later one (a chat
template that rewrites earlier turns) gets its own request. Nothing is approximated: every action token is scored in
exactly the context it was sampled in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..streaming.learner_records import TeacherLoad
from ..types import TurnEvent
from .records import TeacherScores

TeacherScoring = Literal["turn", "trajectory"]
Span = tuple[int, int]  # [start, end) positions of one action in a request's token sequence


@dataclass(frozen=True)
class ScoringRequest:
    """One teacher forward: a token sequence and the action spans to read from it."""

    ids: tuple[int, ...]  # context + action of the longest turn it covers
    turns: tuple[int, ...]  # positions (in the trajectory's event list) of the turns it scores
    spans: tuple[Span, ...]  # each turn's action span in `ids`, in the order of `turns`


def plan_requests(events: Sequence[TurnEvent]) -> list[ScoringRequest]:
    """Cover one trajectory's turn events with the fewest requests whose sequences contain them as prefixes."""
    sequences = [tuple(e.context_ids) + tuple(e.action_ids) for e in events]
    order = sorted(range(len(events)), key=lambda i: len(sequences[i]), reverse=True)
    covers: list[tuple[tuple[int, ...], list[int]]] = []
    for i in order:
        host = next((c for c in covers if c[0][: len(sequences[i])] == sequences[i]), None)
        if host is None:
            covers.append((sequences[i], [i]))
        else:
            host[1].append(i)
    requests = []
    for ids, members in covers:
        members.sort()
        spans = tuple((len(events[i].context_ids), len(sequences[i])) for i in members)
        requests.append(ScoringRequest(ids, tuple(members), spans))
    return requests


def score_spans(teacher, ids: Sequence[int], spans: Sequence[Span]) -> list[TeacherScores]:
    """The teacher's scores of each action span of one sequence: one forward when the scorer offers `score_spans`,
    else one `score(context, action)` call per span (a user's `TeacherScorer` with only the protocol's method)."""
    if hasattr(teacher, "score_spans"):
        return list(teacher.score_spans(ids, spans))
    return [teacher.score(ids[:start], ids[start:end]) for start, end in spans]


class TeacherLedger:
    """The teacher thread's running `TeacherLoad` of one batch."""

    def __init__(self) -> None:
        self.requests = self.prefill_tokens = self.turn_tokens = self.trajectory_tokens = 0
        self.busy_seconds = 0.0
        self._covers: dict[int, list[tuple[int, ...]]] = {}  # per trajectory: the covering sequences so far

    def count(self, request: ScoringRequest, seconds: float) -> None:
        self.requests += 1
        self.prefill_tokens += len(request.ids)
        self.busy_seconds += seconds

    def observe(self, event: TurnEvent) -> None:
        """Add one turn to both schedules' cost: its own request, and, per trajectory, only the tokens by which the
        covering sequence grows (nothing when a known sequence already contains it)."""
        sequence = tuple(event.context_ids) + tuple(event.action_ids)
        self.turn_tokens += len(sequence)
        covers = self._covers.setdefault(event.index, [])
        for k, cover in enumerate(covers):
            if cover[: len(sequence)] == sequence:
                return
            if sequence[: len(cover)] == cover:
                self.trajectory_tokens += len(sequence) - len(cover)
                covers[k] = sequence
                return
        covers.append(sequence)
        self.trajectory_tokens += len(sequence)

    def load(self) -> TeacherLoad:
        return TeacherLoad(self.requests, self.prefill_tokens, self.busy_seconds, self.turn_tokens,
                           self.trajectory_tokens)
