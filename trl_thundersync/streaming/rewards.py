"""Call every reward function on a set of finished trajectories (TRL 1.16 reward contract).

Each function is called once per *call* — one trajectory, one GRPO group or the whole generation batch, as
`reward_scope.py` decides — exactly as `trl.GRPOTrainer._calculate_rewards` calls it: lists over the call's rows of
`prompts`, `completions`, `completion_ids` and every other dataset column (rollout extras override a column of the
same name), plus `trainer_state`, `log_extra`, `log_metric` and, when environments are attached, `environments`.
Reward models (`nn.Module`) score the call's rendered texts in one right-padded forward, as TRL does. `None` means
"not applicable" and becomes NaN; the weighted sum is TRL's float32 `nansum`, and a row on which every function
returned None stays NaN (unscorable). Anything else that goes wrong is a `RewardFunctionError` naming the function
and the call (trajectory, group or batch), never a silent 0.0.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import RewardFunctionError
from ..types import Rollout, ScoredRollout

_RESERVED_COLUMNS = ("prompt", "completion", "completion_ids")


@dataclass(frozen=True)
class RewardContext:
    """Per-call extras TRL hands to reward functions (the same for every call of a batch)."""

    trainer_state: Any
    # (column, trajectory indices of the call's rows, one value per row): TRL's `log_extra` bound to the call's rows,
    # so a column logged one trajectory or one group at a time lands on the right rows of the completions table
    log_extra: Callable[[str, Sequence[int], list], None]
    log_metric: Callable[[str, float], None]  # TRL's `log_metric`: averaged over the step's calls


@dataclass(frozen=True)
class ScoringInput:
    """One finished trajectory with everything a reward call needs for its row."""

    rollout: Rollout  # with `completion` decoded
    prompt: Any  # the raw prompt (text or messages) of the row
    row: Mapping[str, Any]  # the dataset row (its columns become reward kwargs)
    environment: Any = None  # the trajectory's environment instance, if any


def describe_call(items: Sequence[ScoringInput]) -> str:
    """How error messages name a call: 'trajectory 3 (group 1)' or 'group 1 (trajectories 2..3)'."""
    first, last = items[0].rollout, items[-1].rollout
    if len(items) == 1:
        return f"trajectory {first.index} (group {first.group})"
    if first.group == last.group:
        return f"group {first.group} (trajectories {first.index}..{last.index})"
    return f"the generation batch (trajectories {first.index}..{last.index}, groups {first.group}..{last.group})"


class RewardScorer:
    """Turns the `ScoringInput`s of one call into `ScoredRollout`s; holds no trainer state."""

    def __init__(
        self,
        funcs: Sequence[Any],
        names: Sequence[str],
        weights: torch.Tensor,
        *,
        processing_classes: Sequence[Any] | None = None,
        async_loop: asyncio.AbstractEventLoop | None = None,
        render_text: Callable[[Any, Any, Any], str] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.funcs = list(funcs)
        self.names = list(names)
        self.weights = weights.detach().to(torch.float32).cpu()
        self.processing_classes = list(processing_classes or [None] * len(self.funcs))
        self.async_loop = async_loop
        self.render_text = render_text  # (prompt, completion, processing_class) -> text, for reward models
        self.device = torch.device(device)

    def score(self, items: Sequence[ScoringInput], context: RewardContext,
              graded: Mapping[int, Sequence[float]] | None = None) -> list[ScoredRollout]:
        """Call every function once on `items` (in their order) and return one `ScoredRollout` per item.

        `graded`: function index -> its values on `items`, already computed row by row (environment rewards graded
        concurrently, `grading.py`); those functions are not called again."""
        graded = graded or {}
        columns = [list(graded[i]) if i in graded else self.values(i, items, context) for i in range(len(self.funcs))]
        per_row = torch.tensor(columns, dtype=torch.float32).T.reshape(len(items), len(self.funcs))
        scored_at = time.perf_counter()
        out = []
        for item, per_func in zip(items, per_row, strict=True):
            reward = math.nan if torch.isnan(per_func).all() else float((per_func * self.weights).nansum())
            out.append(ScoredRollout(item.rollout, tuple(float(v) for v in per_func), reward, scored_at))
        return out

    def values(self, i: int, items: Sequence[ScoringInput], context: RewardContext) -> list[float]:
        """Function `i` called once on `items`: one float per item, NaN where it returned None."""
        func, name, where = self.funcs[i], self.names[i], describe_call(items)
        try:
            if isinstance(func, torch.nn.Module):
                return self._reward_model(func, self.processing_classes[i], items)
            args = dict(prompts=[x.prompt for x in items], completions=[x.rollout.completion for x in items],
                        completion_ids=[list(x.rollout.completion_ids) for x in items],
                        **self._kwargs(items, context))
            if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):  # noqa: B004 (an async __call__, as TRL checks)
                output = self._run_async(func(**args))
            else:
                output = func(**args)
        except RewardFunctionError:
            raise
        except Exception as exc:
            raise RewardFunctionError(
                f"reward function '{name}' raised {type(exc).__name__}: {exc} on {where}") from exc
        return _checked_values(output, len(items), name, where)

    @staticmethod
    def _kwargs(items: Sequence[ScoringInput], context: RewardContext) -> dict[str, Any]:
        # TRL: the columns of the first row, one list entry per row; rollout_func extras merged into the rows first
        merged = [{**{k: v for k, v in x.row.items() if k not in _RESERVED_COLUMNS}, **x.rollout.extra_fields}
                  for x in items]
        kwargs: dict[str, Any] = {key: [m.get(key) for m in merged] for key in merged[0]}
        kwargs["trainer_state"] = context.trainer_state
        kwargs["log_extra"] = _rows_bound(context.log_extra, tuple(x.rollout.index for x in items))
        kwargs["log_metric"] = context.log_metric
        if any(x.environment is not None for x in items):
            kwargs["environments"] = [x.environment for x in items]
        return kwargs

    def _run_async(self, coroutine) -> Any:
        if self.async_loop is not None:
            return asyncio.run_coroutine_threadsafe(coroutine, self.async_loop).result()
        return asyncio.run(coroutine)

    def _reward_model(self, model: torch.nn.Module, processing_class: Any,
                      items: Sequence[ScoringInput]) -> list[float]:
        """TRL's reward-model call: the call's texts in one forward, right-padded, logits[:, 0]."""
        if self.render_text is None or processing_class is None:
            raise RewardFunctionError("a reward model needs its processing class and a text renderer")
        texts = [self.render_text(x.prompt, x.rollout.completion, processing_class) for x in items]
        inputs = processing_class(text=texts, return_tensors="pt", padding=True, padding_side="right",
                                  add_special_tokens=False)
        inputs = {k: v.to(model.device) for k, v in inputs.items()}
        with torch.inference_mode():
            return model(**inputs).logits[:, 0].float().cpu().tolist()


def _rows_bound(log_extra: Callable[[str, Sequence[int], list], None],
               rows: tuple[int, ...]) -> Callable[[str, list], None]:
    """TRL's `log_extra(column, values)` for one call: `values` has one entry per completion of the call."""

    def bound(column: str, values: list) -> None:
        values = list(values)
        if len(values) != len(rows):  # TRL would misalign the completions table; say so where it happens
            raise ValueError(f"log_extra({column!r}, ...) got {len(values)} values for a call with {len(rows)} "
                             "completions; pass one value per completion")
        log_extra(column, rows, values)

    return bound


def _checked_values(output: Any, expected: int, name: str, where: str) -> list[float]:
    noun = "completion" if expected == 1 else "completions"
    if not isinstance(output, (list, tuple)):
        raise RewardFunctionError(
            f"reward function '{name}' returned {type(output).__name__} on {where}; expected a list with one reward "
            "per completion"
        )
    if len(output) != expected:
        raise RewardFunctionError(
            f"reward function '{name}' returned {len(output)} rewards for {expected} {noun} on {where}; it must "
            "return exactly one reward per completion"
        )
    return [_single_value(value, name, where) for value in output]


def _single_value(value: Any, name: str, where: str) -> float:
    if value is None:
        return math.nan
    try:
        value = float(value)
    except (TypeError, ValueError) as exc:
        raise RewardFunctionError(
            f"reward function '{name}' returned {value!r} on {where}; expected a number or None") from exc
    if math.isnan(value) or math.isinf(value):
        raise RewardFunctionError(
            f"reward function '{name}' returned {value} on {where}; return None for 'not applicable', not NaN/inf"
        )
    return value
