"""TRL's warning for a row on which every reward function returned None (`GRPOTrainer._calculate_rewards`).

TRL 1.16 warns once per reward call — once per generation batch — naming the first such row: its reward kwargs
(dataset columns, rollout extras, its environment) without `trainer_state`, `log_extra` and `log_metric`, then its
prompt and completion. The row then gets reward NaN, is left out of its group's mean and σ, and its advantage is 0;
its tokens still count in the loss normalizers. ThunderSync builds the same text from the whole batch at the barrier,
whatever the reward scope was.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..types import ScoredRollout
from .rewards import RewardContext, RewardScorer, ScoringInput

_HOOKS = ("trainer_state", "log_extra", "log_metric")


def unscorable_warning(items: Sequence[ScoringInput], scored: Sequence[ScoredRollout]) -> str | None:
    """TRL's warning text for the first unscorable row of `items` (the batch, in row order); None if there is none.

    `scored[j]` is the scored rollout of `items[j]`.
    """
    first = next((j for j, s in enumerate(scored) if not s.scorable), None)
    if first is None:
        return None
    kwargs = RewardScorer._kwargs(items, RewardContext(None, None, None))  # the kwargs of one call on the batch
    row = {key: value[first] for key, value in kwargs.items() if key not in _HOOKS}
    row["prompt"] = items[first].prompt
    row["completion"] = items[first].rollout.completion
    return (f"All reward functions returned None for the following kwargs:\n{row}\n"
            "Please ensure that at least one reward function returns a valid reward.")
