"""The end-of-run summary of a training run: steps, its logged reward, and the timings that set the speedup.

    steps = read_jsonl("out/thundersync_trace/steps.jsonl")
    files = export_run(steps, "out/thundersync_trace")      # Chrome/Perfetto trace + timeline PNG of the last steps
    print(format_summary(summarize_run(steps, trainer.state.log_history, optimizer_steps=3, files=files)))

Per traced step, in seconds (notation of paper Appendix F, `model.py`): rollout R (batch admitted → last reward
known), learner busy L (time the learner lane worked), learner idle (time before its last item ended that the lane
had no ready work: c_n − L), learner tail [c_n − R]⁺ (learner work left when the rollout closed), suffix P (barrier,
optimizer step, publication), wall = R + tail + P. `sync_equivalent` = R + L + P is the same work with the learner
waiting for the rollout (the paper's Sync, Eq. 16); wall / sync_equivalent is what overlapping them saved.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .export import merge_intervals, plot_timeline, write_chrome_trace
from .records import StepTrace

# Logged per-step quality metrics, first found wins: GRPO's mean reward, then the distillation objectives'.
QUALITY_METRICS = ("reward", "opd/reverse_kl", "loss")
CHROME_TRACE_STEPS = 8  # the Chrome trace holds the last N steps (a long run's full trace would be huge)
TIMELINE_STEPS = 3  # the timeline PNG shows the last N steps


@dataclass(frozen=True)
class StepTimings:
    """Where one step's wall time went (seconds, see the module docstring)."""

    step: int  # optimizer step index (the policy version its batch was sampled with)
    schedule: str  # "thundersync" or "sync"
    rollout: float  # R
    learner_busy: float  # L: union of the learner lane's work intervals
    learner_idle: float  # c_n − L: lane waiting for ready work before its last item ended
    learner_tail: float  # [c_n − R]⁺
    suffix: float  # P: max(R, c_n) → weights published and acknowledged
    wall: float  # R + tail + P

    @property
    def sync_equivalent(self) -> float:
        """R + L + P: this step's work with the learner waiting for the rollout to close."""
        return self.rollout + self.learner_busy + self.suffix


def step_timings(step: StepTrace) -> StepTimings:
    """Measured timings of one recorded step."""
    learner = merge_intervals([(e.start, e.end) for e in step.events if e.lane == "learner"])
    busy = math.fsum(b - a for a, b in learner)
    rollout = step.rollout_end - step.start
    learner_end = step.learner_end - step.start
    return StepTimings(step=step.step, schedule=step.schedule, rollout=rollout, learner_busy=busy,
                       learner_idle=max(0.0, learner_end - busy), learner_tail=max(0.0, learner_end - rollout),
                       suffix=max(0.0, step.publish_end - max(step.rollout_end, step.learner_end)), wall=step.wall)


@dataclass(frozen=True)
class RunSummary:
    """What `format_summary` prints at the end of a run."""

    optimizer_steps: int  # optimizer steps the run took (trainer.state.global_step)
    metric: str | None  # the logged quality metric (QUALITY_METRICS; None: none logged)
    metric_values: tuple[float, ...]  # its value per logged step, in order
    steps: tuple[StepTimings, ...]  # one per traced step (empty: tracing off)
    files: tuple[tuple[str, Path], ...]  # (what, path) of the run's trace artifacts

    def mean(self, name: str) -> float:
        """Mean of a `StepTimings` field (or `sync_equivalent`) over the traced steps."""
        if not self.steps:
            raise ValueError("no traced steps: the run recorded no trace")
        return math.fsum(getattr(s, name) for s in self.steps) / len(self.steps)


def summarize_run(steps: Sequence[StepTrace], log_history: Sequence[Mapping[str, object]], *, optimizer_steps: int,
                  files: Sequence[tuple[str, Path]] = ()) -> RunSummary:
    """Timings of every traced step and the first quality metric of `log_history` (TrainerState.log_history)."""
    metric, values = None, ()
    for name in QUALITY_METRICS:
        logged = tuple(float(row[name]) for row in log_history if isinstance(row.get(name), (int, float)))
        if logged:
            metric, values = name, logged
            break
    return RunSummary(optimizer_steps=optimizer_steps, metric=metric, metric_values=values,
                      steps=tuple(step_timings(s) for s in steps), files=tuple(files))


def export_run(steps: Sequence[StepTrace], folder: str | Path) -> list[tuple[str, Path]]:
    """Write `trace.json` (Chrome/Perfetto, the last CHROME_TRACE_STEPS steps) and `timeline.png` (the last
    TIMELINE_STEPS steps; skipped without matplotlib) into `folder`; returns (what, path) of what was written."""
    if not steps:
        return []
    folder = Path(folder)
    files = [("Chrome/Perfetto trace (https://ui.perfetto.dev)",
              write_chrome_trace(steps[-CHROME_TRACE_STEPS:], folder / "trace.json"))]
    try:
        files.append(("timeline", plot_timeline(steps[-TIMELINE_STEPS:], folder / "timeline.png")))
    except ImportError:  # matplotlib is an optional extra; the summary says where to get it
        pass
    return files


def format_summary(summary: RunSummary) -> str:
    """A few lines for the end of a run: steps, metric, mean step timings and the trace files."""
    lines = [f"run summary: {summary.optimizer_steps} optimizer steps"]
    if summary.metric is not None:
        v = summary.metric_values
        lines[0] += (f"; {summary.metric} {v[0]:.4g} (first logged step) → {v[-1]:.4g} (last), "
                     f"mean {math.fsum(v) / len(v):.4g}")
    if summary.steps:
        m = summary.mean
        schedules = "/".join(sorted({s.schedule for s in summary.steps}))
        lines.append(f"  per step (mean of {len(summary.steps)} traced, schedule {schedules}): wall {m('wall'):.2f}s"
                     f" = rollout {m('rollout'):.2f}s + learner tail {m('learner_tail'):.2f}s"
                     f" + barrier/optimizer/publish {m('suffix'):.2f}s")
        sync = m("sync_equivalent")
        lines.append(f"  learner busy {m('learner_busy'):.2f}s, idle {m('learner_idle'):.2f}s before its last item; "
                     f"waiting for the rollout (R + L + P) would take {sync:.2f}s: "
                     f"{sync / m('wall') if m('wall') else 1.0:.2f}x from overlap")
    else:
        lines.append("  no trace recorded (trace=False): no step timings")
    for what, path in summary.files:
        lines.append(f"  {what}: {path}")
    if summary.steps and not any(what == "timeline" for what, _ in summary.files):
        lines.append('  timeline: not drawn (needs matplotlib: pip install "trl-thundersync[plots]")')
    return "\n".join(lines)
