"""Score one trajectory with every reward function, as soon as it finishes (TRL 1.16 reward contract).

Each function is called exactly as `trl.GRPOTrainer` calls it, with one-element lists: `prompts`, `completions`,
`completion_ids`, every other dataset column, `trainer_state`, `log_extra`, `log_metric` (and `environments` when
an environment is attached). `None` means "not applicable" and becomes NaN; the weighted sum is TRL's float32
`nansum`, and a row on which every function returned None stays NaN (unscorable). Anything else that goes wrong is a
`RewardFunctionError` naming the function and the trajectory, never a silent 0.0.
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
    """Per-call extras TRL hands to reward functions."""

    trainer_state: Any
    log_extra: Callable[[str, list], None]
    log_metric: Callable[[str, float], None]
    environment: Any = None  # the trajectory's environment instance, if any


class RewardScorer:
    """Turns a `Rollout` into a `ScoredRollout`; holds no trainer state."""

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

    def score(self, rollout: Rollout, prompt: Any, row: Mapping[str, Any], context: RewardContext) -> ScoredRollout:
        kwargs: dict[str, Any] = {k: [v] for k, v in row.items() if k not in _RESERVED_COLUMNS}
        kwargs.update({k: [v] for k, v in rollout.extra_fields.items()})
        kwargs["trainer_state"] = context.trainer_state
        kwargs["log_extra"] = context.log_extra
        kwargs["log_metric"] = context.log_metric
        if context.environment is not None:
            kwargs["environments"] = [context.environment]
        values = [self._call(i, rollout, prompt, kwargs) for i in range(len(self.funcs))]
        per_func = torch.tensor(values, dtype=torch.float32)
        if torch.isnan(per_func).all():
            reward = math.nan
        else:
            reward = float((per_func * self.weights).nansum())
        return ScoredRollout(rollout, tuple(float(v) for v in values), reward, time.perf_counter())

    def _call(self, i: int, rollout: Rollout, prompt: Any, kwargs: dict[str, Any]) -> float:
        func, name = self.funcs[i], self.names[i]
        where = f"trajectory {rollout.index} (group {rollout.group})"
        try:
            if isinstance(func, torch.nn.Module):
                return self._reward_model(func, self.processing_classes[i], prompt, rollout.completion)
            args = dict(prompts=[prompt], completions=[rollout.completion],
                        completion_ids=[list(rollout.completion_ids)], **kwargs)
            if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):
                output = self._run_async(func(**args))
            else:
                output = func(**args)
        except RewardFunctionError:
            raise
        except Exception as exc:
            raise RewardFunctionError(f"reward function '{name}' raised {type(exc).__name__}: {exc} on {where}") from exc
        return _single_value(output, name, where)

    def _run_async(self, coroutine) -> Any:
        if self.async_loop is not None:
            return asyncio.run_coroutine_threadsafe(coroutine, self.async_loop).result()
        return asyncio.run(coroutine)

    def _reward_model(self, model: torch.nn.Module, processing_class: Any, prompt: Any, completion: Any) -> float:
        if self.render_text is None or processing_class is None:
            raise RewardFunctionError("a reward model needs its processing class and a text renderer")
        text = self.render_text(prompt, completion, processing_class)
        inputs = processing_class(text=[text], return_tensors="pt", add_special_tokens=False)
        inputs = {k: v.to(model.device) for k, v in inputs.items()}
        with torch.inference_mode():
            return float(model(**inputs).logits[0, 0])


def _single_value(output: Any, name: str, where: str) -> float:
    if not isinstance(output, (list, tuple)):
        raise RewardFunctionError(
            f"reward function '{name}' returned {type(output).__name__} on {where}; expected a list with one reward "
            "per completion"
        )
    if len(output) != 1:
        raise RewardFunctionError(
            f"reward function '{name}' returned {len(output)} rewards for 1 completion on {where}; it must return "
            "exactly one reward per completion"
        )
    value = output[0]
    if value is None:
        return math.nan
    try:
        value = float(value)
    except (TypeError, ValueError) as exc:
        raise RewardFunctionError(f"reward function '{name}' returned {value!r} on {where}; expected a number or None") from exc
    if math.isnan(value) or math.isinf(value):
        raise RewardFunctionError(
            f"reward function '{name}' returned {value} on {where}; return None for 'not applicable', not NaN/inf"
        )
    return value
