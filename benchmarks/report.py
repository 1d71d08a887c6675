"""Printed tables, the spread plot and the machine description of the benchmark command.

`print_point` writes one table per benchmark point (one row per schedule) and a line comparing ThunderSync's
measured speedup with the trace-replay prediction. Plots draw on a bare matplotlib `Figure`, like `trace.export`.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .stats import Comparison, ScheduleSummary
from .workload import Workload


def _fmt(x: float | None, spec: str) -> str:
    """`format(x, spec)`, or a dash aligned the same way for a missing value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return format("-", spec.split(".")[0].rstrip("f") or "")
    return format(x, spec)


def describe(w: Workload, calibrated: bool, pinned: bool) -> str:
    """One line: the workload of a point."""
    calls = "sandboxed tool calls" if w.sandbox else "tool calls (in-process sleeps, no sandbox)"
    rollout = (f"{w.turns} {calls}/trajectory, latency mean {w.latency_mean:.3f} s, CV "
               f"{w.latency_cv:g}, {w.concurrency} slots")
    if w.grading_latency > 0:
        rollout += f", grading {w.grading_latency:g} s mean after the last turn"
    if w.reward_scope != "auto":
        rollout += f", reward_scope={w.reward_scope}"
    if calibrated:
        rollout += f" (calibrated for ρ = {w.balance:g})"
    cores = ", learner pinned to one core and rollout to the other(s)" if pinned else ""
    return f"B={w.batch} G={w.group} steps={w.steps}, model {w.hidden}x{w.layers}, {rollout}{cores}"


HEADER = (f"{'schedule':<19} {'step s':>7} {'± sd':>6} {'speedup':>7} {'R s':>6} {'L s':>6} {'ρ=L/R':>6} "
          f"{'idle':>5} {'tail s':>6} {'TFLOP/s':>8} {'MFU':>6} {'RSS MB':>7} {'stats MB':>8} {'cores':>5} "
          f"{'other':>5}")


def table_row(schedule: str, s: ScheduleSummary, speedup: float | None) -> str:
    """One row of `HEADER` (stats MB is '-' for stock TRL, which keeps no gradient statistics)."""
    stats_mb = _fmt(s.stats_peak_mb if schedule != "trl" else None, ">8.2f")
    return (f"{schedule:<19} {s.step_wall_s:>7.3f} {s.step_wall_stdev_s:>6.3f} {_fmt(speedup, '>6.2f')}x "
            f"{s.rollout_s:>6.2f} {s.learner_busy_s:>6.2f} {s.balance_ratio:>6.2f} "
            f"{s.learner_idle_fraction:>5.2f} {s.learner_tail_s:>6.2f} {s.learner_tflops_per_s:>8.4f} "
            f"{_fmt(s.mfu, '>6.4f')} {s.peak_rss_mb:>7.0f} {stats_mb} {s.cpu_cores_used:>5.2f} "
            f"{s.foreign_cpu_cores:>5.2f}")


def prediction_line(stats: dict[str, ScheduleSummary], cmp: Comparison) -> str | None:
    """Measured ThunderSync speedup next to the replay prediction (None without both schedules)."""
    if cmp.predicted_speedup is None or cmp.measured_speedup_step is None:
        return None
    name = cmp.primary or "thundersync"
    ts = stats[name]
    own = ts.replay_abs_error
    return (f"{name} vs sync: measured {cmp.measured_speedup_step:.2f}x (step walls), "
            f"{cmp.measured_speedup_trace:.2f}x (trace walls); predicted {cmp.predicted_speedup:.2f}x (replay of the "
            f"sync traces, Eq. 14), gap {cmp.prediction_gap * 100:+.1f}%; replay error on {name}'s own steps "
            f"{_fmt(None if own is None else own * 100, '.1f')}%; trajectory-duration CV "
            f"{stats['sync'].trajectory_duration_cv:.2f}; overlap slowed the learner by "
            f"{ts.learner_busy_s / stats['sync'].learner_busy_s - 1:+.0%} and the rollout by "
            f"{ts.rollout_s / stats['sync'].rollout_s - 1:+.0%} (L and R vs sync); {name} "
            f"backward median {_fmt(_ms(ts.backward_during_rollout_s), '.0f')} ms during rollout, "
            f"{_fmt(_ms(ts.backward_after_rollout_s), '.0f')} ms after")


def mode_predictions(stats: dict[str, ScheduleSummary]) -> dict[str, dict[str, float]]:
    """Predicted speedup over sync of every release mode, replaying the sync traces and the reward-release ones:
    trace's schedule → {mode: (R + L + P) ÷ T_mode}, both from that schedule's steps."""
    out = {}
    for name in ("sync", "thundersync", "thundersync:reward"):
        s = stats.get(name)
        if s is not None and s.replay_release_s:
            out[name] = {mode: s.replay_sync_s / t for mode, t in s.replay_release_s.items()}
    return out


def release_lines(stats: dict[str, ScheduleSummary], cmp: Comparison) -> list[str]:
    """One line per ThunderSync schedule when there are several (one per release point): measured speedup, the
    replay prediction of its release point from the sync traces and from the reward-release traces, and its tail."""
    names = list(cmp.predicted_from_sync or {})
    if len(names) < 2 and not any(":" in n for n in names):
        return []
    lines = [f"replay of the {source} traces predicts " + ", ".join(f"{mode} {x:.2f}x" for mode, x in modes.items())
             for source, modes in mode_predictions(stats).items()]
    for name in names:
        s = stats[name]
        from_reward = (cmp.predicted_from_reward or {}).get(name)
        lines.append(f"{name:<19} measured {cmp.speedup[name]:.2f}x; predicted {cmp.predicted_from_sync[name]:.2f}x "
                     f"(replay of sync), {_fmt(from_reward, '.2f')}x (replay of reward release); gap "
                     f"{cmp.prediction_gaps[name] * 100:+.1f}%; learner tail {s.learner_tail_s:.2f} s "
                     f"({s.learner_tail_s / s.step_wall_s:.1%} of the step)")
    return lines


def learner_thread_lines(stats: dict[str, ScheduleSummary]) -> list[str]:
    """Per schedule that recorded it: the CPU seconds and preemptions per step of the thread that runs
    `training_step`, next to L. CPU above sync's means the learner computed longer (smaller passes, colder caches);
    L above its CPU means it waited for its core. Stock TRL's thread also generates, so its CPU is not the learner's."""
    sync = stats.get("sync")
    lines = []
    for name, s in stats.items():
        if s.learner_cpu_s is None:
            continue
        vs = ""
        if sync is not None and sync.learner_cpu_s and name != "sync":
            vs = (f", {s.learner_cpu_s / sync.learner_cpu_s - 1:+.0%} vs sync "
                  f"(L {s.learner_busy_s / sync.learner_busy_s - 1:+.0%})")
        lines.append(f"learner thread {name}: CPU {s.learner_cpu_s:.2f} s/step{vs}, L {s.learner_busy_s:.2f} s, "
                     f"{s.learner_preemptions:.0f} preemptions/step")
    return lines


def gap_lines(cmp: Comparison) -> list[str]:
    """Per ThunderSync schedule, its traced step against its release point's replay on the sync traces, split by
    phase (`gap_split.py`): where the overlap cost (or saved) time, in seconds per step."""
    lines = []
    for name, g in (cmp.gap_splits or {}).items():
        lines.append(f"{name:<19} traced step {g.measured_s:.2f} s vs replay {g.predicted_s:.2f} s "
                     f"({g.measured_s - g.predicted_s:+.2f}) = rollout {g.rollout_s:+.2f} + learner tail "
                     f"{g.tail_s:+.2f} + barrier/publish {g.suffix_s:+.2f}; learner busy {g.learner_s:+.2f} s vs sync")
    return lines


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def print_point(name: str, description: str, stats: dict[str, ScheduleSummary], cmp: Comparison) -> None:
    print(f"\n== {name}: {description}")
    print(HEADER)
    for schedule, s in stats.items():
        print(table_row(schedule, s, cmp.speedup.get(schedule)))
    line = prediction_line(stats, cmp)
    if line is not None:
        print(line)
    for line in release_lines(stats, cmp) + gap_lines(cmp) + learner_thread_lines(stats):
        print(line)
    print("columns: R rollout, L learner service, idle = 1 − L/step, tail = learner time after R, stats = gradient "
          "statistics memory, cores = CPU this run used, other = CPU other processes used meanwhile (machine noise)")


def _signed_ms(seconds: float | None, digits: int = 0) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:+.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def overlap_rows(stats: dict[str, ScheduleSummary], cmp: Comparison) -> list[tuple[str, ...]]:
    """Per schedule: the overlap cost on each side (stats.py): learner backward during / after R and vs sync,
    rollout turns and tool calls with the learner busy / idle and (busy ones) vs the same work in sync."""
    rows = []
    for name, s in stats.items():
        vs = (cmp.overlap_vs_sync or {}).get(name, {})
        bwd, turn, tool = (vs.get(k, {}) for k in ("backward_during_vs_sync", "turn_busy_vs_sync",
                                                    "tool_busy_vs_sync"))
        rows.append((name, f"{_fmt(_ms(s.backward_during_rollout_s), '.0f')}/"
                           f"{_fmt(_ms(s.backward_after_rollout_s), '.0f')}", _pct(bwd.get("relative")),
                     f"{_fmt(_ms(s.turn_busy_s), '.1f')}/{_fmt(_ms(s.turn_idle_s), '.1f')} "
                     f"({s.turn_busy_n}/{s.turn_idle_n})",
                     f"{_pct(turn.get('relative'))} ({_signed_ms(turn.get('seconds'), 1)} ms)",
                     f"{_fmt(_ms(s.tool_busy_s), '.0f')}/{_fmt(_ms(s.tool_idle_s), '.0f')} "
                     f"({s.tool_busy_n}/{s.tool_idle_n})",
                     f"{_pct(tool.get('relative'))} ({_signed_ms(tool.get('seconds'))} ms)"))
    return rows


OVERLAP_HEADER = ("schedule", "backward ms during/after R", "vs sync", "turn ms busy/idle (n)", "vs sync",
                  "tool ms busy/idle (n)", "vs sync")


def print_overlap(stats: dict[str, ScheduleSummary], cmp: Comparison) -> None:
    rows = [OVERLAP_HEADER] + overlap_rows(stats, cmp)
    widths = [max(len(r[k]) for r in rows) for k in range(len(OVERLAP_HEADER))]
    print("overlap cost per side (medians; busy = learner items cover ≥ half the interval, idle = none; vs sync = "
          "the same trajectory / turn / tool call in the sync runs):")
    for r in rows:
        cells = enumerate(zip(r, widths, strict=True))
        print("  " + "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in cells))


@dataclass(frozen=True)
class SpreadPoint:
    """One point of the spread sweep."""

    duration_cv: float  # realized trajectory-duration CV (sync runs)
    measured: float  # measured speedup over sync
    predicted: float  # trace-replay prediction


def plot_spread(points: Sequence[SpreadPoint], path: Path) -> Path:
    """Speedup over Sync against the realized trajectory-duration CV, measured and replay-predicted."""
    from matplotlib.figure import Figure

    rows = sorted(points, key=lambda p: p.duration_cv)
    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.subplots()
    ax.axhline(2.0, color="black", linestyle="--", linewidth=1, label="2× bound (Eq. 17)")
    ax.plot([p.duration_cv for p in rows], [p.predicted for p in rows], "o-", mfc="none", color="tab:blue",
            label="predicted (replay of sync traces)")
    ax.plot([p.duration_cv for p in rows], [p.measured for p in rows], "o", color="tab:red", label="measured")
    ax.set_xlabel("trajectory-duration coefficient of variation (realized)")
    ax.set_ylabel("speedup over Sync")
    ax.set_ylim(min([0.9] + [p.measured - 0.05 for p in rows]), 2.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("ThunderSync speedup vs. trajectory-duration spread (ρ ≈ 1)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path


def machine() -> dict[str, Any]:
    """CPU model, core count, memory and Python of this machine, for the report."""
    model = platform.processor() or "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except FileNotFoundError:  # no util-linux: keep platform.processor()
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"nproc": os.cpu_count(), "cpu": model, "memory_gib": round(mem, 1), "python": platform.python_version(),
            "platform": platform.platform()}


def write_report(out: Path, command: str, started: float, files: dict[str, str], **fields: Any) -> dict[str, Any]:
    """The benchmark's JSON report: command, date, machine, the run's own `fields`, its files and duration."""
    report = {"command": command, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "machine": machine(), **fields, "files": files, "seconds": time.perf_counter() - started}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {', '.join(files.values())}  ({report['seconds']:.0f} s)")
    return report
