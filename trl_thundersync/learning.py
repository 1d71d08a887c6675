"""Learning curves of a run: the logged reward and held-out success per optimizer step against wall-clock seconds,
their plots, and when a curve first reaches a level (time to quality).

    curve = LearningCurve(evaluate=lambda model, tokenizer: evaluate_lookup(model, tokenizer).success, every=10)
    trainer = ThunderSyncGRPOTrainer(..., callbacks=[curve])
    trainer.train()
    plot_curves({"thundersync": curve.points}, "reward_vs_time.png", x="seconds")

The clock starts at `on_train_begin` and stops while a held-out evaluation runs (`evaluated_s` records how long), so
`seconds` is training time only and evaluating more often does not make a run look slower.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from transformers import TrainerCallback

from .errors import ConfigurationError

Axis = Literal["step", "seconds"]


@dataclass(frozen=True)
class CurvePoint:
    """One logged optimizer step."""

    step: int  # trainer.state.global_step when the step's metrics were logged (1-based)
    seconds: float  # training wall-clock since on_train_begin, held-out evaluations excluded
    reward: float  # the step's logged training metric: TRL's mean `reward` by default (`LearningCurve(metric=...)`)
    heldout: float | None  # held-out score after this step, where it was evaluated (else None)


class LearningCurve(TrainerCallback):
    """Records a `CurvePoint` per logged step (`logging_steps=1` gives every step). `evaluate(model,
    processing_class) -> float`, if given, runs before training (step 0), after every `every`-th step and after the
    last one, with the clock stopped. `metric`: the logged key a point records (GRPO's `reward`; a distillation run
    logs no reward: `"loss"`)."""

    def __init__(self, evaluate: Callable[[Any, Any], float] | None = None, every: int = 10,
                 metric: str = "reward") -> None:
        if every < 1:
            raise ConfigurationError(f"LearningCurve every={every} must be >= 1")
        self.evaluate, self.every, self.metric = evaluate, every, metric
        self.points: list[CurvePoint] = []
        self.heldout: list[tuple[int, float, float]] = []  # (step, seconds, score): step 0 = before training
        self.evaluated_s = 0.0  # wall-clock spent in evaluations (not counted in `seconds`)
        self._start = 0.0

    def seconds(self) -> float:
        return time.perf_counter() - self._start - self.evaluated_s

    def _evaluate(self, model, processing_class, step: int) -> float | None:
        if self.evaluate is None or (self.heldout and self.heldout[-1][0] == step):
            return None
        began = time.perf_counter()
        score = float(self.evaluate(model, processing_class))
        self.evaluated_s += time.perf_counter() - began
        self.heldout.append((step, self.seconds(), score))
        return score

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._start = time.perf_counter()
        self._evaluate(model, processing_class, 0)
        self._start, self.evaluated_s = time.perf_counter(), 0.0  # the first evaluation is not training time

    def on_log(self, args, state, control, logs=None, model=None, processing_class=None, **kwargs):
        if not logs or self.metric not in logs:
            return
        step = state.global_step
        last = step >= state.max_steps > 0
        score = self._evaluate(model, processing_class, step) if (step % self.every == 0 or last) else None
        self.points.append(CurvePoint(step=step, seconds=self.seconds(), reward=float(logs[self.metric]),
                                      heldout=score))


def window_means(points: Sequence[CurvePoint], k: int) -> tuple[float, float]:
    """Mean reward of the first `k` and of the last `k` points (k is cut to half the points, at least 1)."""
    if not points:
        raise ConfigurationError("no logged rewards: set logging_steps=1 and train at least one step")
    k = max(1, min(k, len(points) // 2))
    return (sum(p.reward for p in points[:k]) / k, sum(p.reward for p in points[-k:]) / k)


def first_reaching(points: Sequence[tuple[float, float]], level: float) -> float | None:
    """The first x of (x, value) `points` (in order) whose value is >= `level`, or None if none is."""
    return next((x for x, value in points if value >= level), None)


def smoothed(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over `window` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_curves(curves: Mapping[str, Sequence[CurvePoint]], path: str | Path, x: Axis = "seconds",
                window: int = 5, heldout: Mapping[str, Sequence[tuple[int, float, float]]] | None = None,
                metric: str = "training reward") -> Path:
    """The curves' metric (`metric` names it on the axis; moving average over `window` steps, raw points faint) of
    each named curve against `x`; with `heldout` (name -> LearningCurve.heldout) a second panel of held-out score.
    Writes a PNG at `path`."""
    from .trace.export import new_figure

    if x not in ("step", "seconds"):
        raise ConfigurationError(f"plot x={x!r} is not 'step' or 'seconds'")
    fig = new_figure((7.0, 6.0) if heldout else (7.0, 3.6))
    axes = fig.subplots(2 if heldout else 1, 1, sharex=True, squeeze=False)[:, 0]
    for index, (name, points) in enumerate(curves.items()):
        colour = f"C{index % 10}"
        xs = [getattr(p, x) for p in points]
        rewards = [p.reward for p in points]
        axes[0].plot(xs, rewards, ".", color=colour, alpha=0.3)
        axes[0].plot(xs, smoothed(rewards, window), "-", color=colour, label=name)
        if heldout and heldout.get(name):
            hx = [step if x == "step" else seconds for step, seconds, _ in heldout[name]]
            axes[1].plot(hx, [score for _, _, score in heldout[name]], "o-", color=colour, label=name)
    axes[0].set_ylabel(f"{metric} ({window}-step mean)")
    axes[0].legend(fontsize=7)
    if heldout:
        axes[1].set_ylabel("held-out success")
    axes[-1].set_xlabel("optimizer step" if x == "step" else "training wall-clock (s)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
