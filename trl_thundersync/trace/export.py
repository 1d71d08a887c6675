"""Exports of recorded steps: Chrome/Perfetto JSON, JSON lines, a Figure-3-style timeline PNG and a speedup plot.

    steps = read_jsonl("out/thundersync_trace/steps.jsonl")
    write_chrome_trace(steps, "trace.json")       # open in https://ui.perfetto.dev or chrome://tracing
    plot_timeline(steps[:3], "timeline.png")      # needs matplotlib: pip install "trl-thundersync[plots]"

Plots draw on a bare matplotlib `Figure` (Agg canvas, no pyplot state), imported only when a plot is asked for.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model import full_overlap_limit
from .records import StepTrace, TraceEvent

# Chrome trace processes (one per lane group) in display order; rollout and tool get one thread per trajectory.
_PIDS = {"step": 1, "rollout": 2, "tool": 3, "learner": 4, "barrier": 5, "publish": 5}
_PROCESS_NAMES = {1: "steps", 2: "rollout (one thread per trajectory)", 3: "tool calls", 4: "learner",
                  5: "barrier / publish"}
_PER_TRAJECTORY = ("rollout", "tool")


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _lane_ids(event: TraceEvent, extra_pids: dict[str, int]) -> tuple[int, int, str]:
    """(pid, tid, thread name) of an event's lane."""
    if event.lane in _PER_TRAJECTORY:
        tid = event.index + 1  # tid 0 holds batch-level events (index −1)
        return _PIDS[event.lane], tid, f"trajectory {event.index}" if event.index >= 0 else "batch"
    if event.lane in ("barrier", "publish"):
        return _PIDS[event.lane], 1 if event.lane == "barrier" else 2, event.lane
    if event.lane == "learner":
        return _PIDS["learner"], 1, "learner lane"
    pid = extra_pids.setdefault(event.lane, max(_PROCESS_NAMES) + 1 + len(extra_pids))
    return pid, 1, event.lane


def to_chrome_trace(steps: Sequence[StepTrace]) -> dict[str, Any]:
    """Chrome "Trace Event Format": complete ("X") events in µs relative to the first step's start.

    One process per lane group, one thread per lane; rollout and tool events are on one thread per trajectory so
    concurrent rollouts stack visibly. Each step is also a slice on the "steps" process, with R, c_n and P in args.
    """
    if not steps:
        raise ValueError("to_chrome_trace needs at least one step")
    origin = min(s.start for s in steps)
    events: list[dict[str, Any]] = []
    threads: dict[tuple[int, int], str] = {(1, 1): "steps"}
    extra_pids: dict[str, int] = {}
    for s in steps:
        events.append({"name": f"step {s.step} ({s.schedule})", "cat": "step", "ph": "X", "pid": 1, "tid": 1,
                       "ts": _us(s.start - origin), "dur": _us(s.wall),
                       "args": {"step": s.step, "schedule": s.schedule, "rollout_end_us": _us(s.rollout_end - origin),
                                "learner_end_us": _us(s.learner_end - origin),
                                "barrier_end_us": _us(s.barrier_end - origin), "stats_bytes": s.stats_bytes}})
        for e in s.events:
            pid, tid, thread = _lane_ids(e, extra_pids)
            threads[(pid, tid)] = thread
            args: dict[str, Any] = {"step": s.step, "index": e.index, "group": e.group, "turn": e.turn,
                                    "policy_version": e.policy_version, "tokens": e.tokens}
            if e.ready is not None:
                args["ready_us"] = _us(e.ready - origin)
            if e.flops:
                args["flops"] = e.flops
            events.append({"name": e.kind, "cat": e.lane, "ph": "X", "pid": pid, "tid": tid,
                           "ts": _us(e.start - origin), "dur": _us(e.end - e.start), "args": args})
    names = {**_PROCESS_NAMES, **{pid: lane for lane, pid in extra_pids.items()}}
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}
            for pid, name in names.items()]
    meta += [{"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
             for pid in names]
    meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
             for (pid, tid), name in sorted(threads.items())]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_chrome_trace(steps: Sequence[StepTrace], path: str | Path) -> Path:
    """Write `to_chrome_trace(steps)` as JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_chrome_trace(steps)))
    return path


# --- JSON lines ----------------------------------------------------------------------------------------------------


def write_jsonl(steps: Sequence[StepTrace], path: str | Path) -> Path:
    """One `dataclasses.asdict(step)` per line (the format `TraceWriter` appends); overwrites `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for s in steps:
            f.write(json.dumps(dataclasses.asdict(s)) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[StepTrace]:
    """Inverse of `write_jsonl`; a malformed line raises ValueError naming the file and line."""
    steps = []
    with Path(path).open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                events = tuple(TraceEvent(**e) for e in d.pop("events"))
                steps.append(StepTrace(**d, events=events))
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{n}: not a StepTrace record ({err})") from err
    return steps


# --- Plots ---------------------------------------------------------------------------------------------------------


def new_figure(figsize: tuple[float, float]) -> Any:
    """A matplotlib Figure drawn with Agg, without pyplot (no global backend or figure registry is touched)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError('plotting needs matplotlib: pip install "trl-thundersync[plots]"') from err
    return Figure(figsize=figsize)


def merge_intervals(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping [start, end] intervals (busy time of a lane with concurrent work)."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


# Timeline rows, top to bottom: (label, y).
_ROWS = (("rollout busy", 3), ("tool calls", 2), ("learner busy", 1), ("barrier / publish", 0))
_LEARNER_COLORS = {"source_backward": "tab:green", "group_fold": "tab:purple", "content_backward": "limegreen",
                   "turn_backward": "seagreen", "turn_close": "darkslategray", "bind": "tab:pink",
                   "prefix_forward": "olive", "prefix_backward": "darkolivegreen"}


def plot_timeline(steps: Sequence[StepTrace], path: str | Path, title: str | None = None) -> Path:
    """PNG timeline in the style of the paper's Figure 3: one row per lane, time on x, idle time as gaps.

    Rollout and tool rows show the union of concurrent intervals; the learner row shows each item (ready times τ_j
    as ticks); dashed lines mark each step's start and end, dotted lines its rollout close R.
    """
    if not steps:
        raise ValueError("plot_timeline needs at least one step")
    origin = min(s.start for s in steps)
    end = max(s.publish_end for s in steps) - origin
    fig = new_figure((12, 3.6))
    ax = fig.subplots()
    h = 0.6
    events = [e for s in steps for e in s.events]

    def bars(y: float, lane: str, kinds: Sequence[str] | None, color: str, label: str, merge: bool) -> None:
        spans = [(e.start - origin, e.end - origin) for e in events
                 if e.lane == lane and (kinds is None or e.kind in kinds)]
        spans = merge_intervals(spans) if merge else spans
        if spans:
            ax.broken_barh([(a, b - a) for a, b in spans], (y - h / 2, h), facecolors=color,
                           edgecolor="none" if merge else "white", linewidth=0.5, label=label)

    bars(3, "rollout", ("trajectory", "turn"), "tab:blue", "rollout (≥ 1 trajectory generating)", merge=True)
    bars(3, "rollout", ("reward",), "tab:cyan", "reward scoring", merge=True)
    bars(2, "tool", None, "tab:orange", "tool call", merge=True)
    learner_kinds = sorted({e.kind for e in events if e.lane == "learner"}, key=lambda k: (k != "source_backward", k))
    for kind in learner_kinds:
        bars(1, "learner", (kind,), _LEARNER_COLORS.get(kind, "tab:olive"), kind.replace("_", " "), merge=False)
    bars(0, "barrier", None, "tab:red", "normalize + clip + optimizer step", merge=False)
    bars(0, "publish", None, "tab:brown", "publish weights (acknowledged)", merge=False)
    ready = [e.ready - origin for s in steps for e in s.events if e.lane == "learner" and e.ready is not None]
    if ready:
        ax.plot(ready, [1 + h / 2 + 0.08] * len(ready), linestyle="none", marker="v", markersize=4, color="black",
                label=r"learner item ready ($\tau_j$)")
    for s in steps:
        for x, style in ((s.start - origin, "--"), (s.publish_end - origin, "--"), (s.rollout_end - origin, ":")):
            ax.axvline(x, color="0.35", linestyle=style, linewidth=0.9)
        ax.text(s.start - origin + end * 0.004, 3.55, f"step {s.step} ({s.schedule})", fontsize=8, va="bottom")
        ax.text(s.rollout_end - origin + end * 0.003, 3.55, "R", fontsize=8, va="bottom", color="0.25")
    ax.set_yticks([y for _, y in _ROWS], [label for label, _ in _ROWS])
    ax.set_ylim(-0.5, 3.9)
    ax.set_xlim(0, end * 1.01 if end > 0 else 1.0)
    ax.set_xlabel("time since first step start (s)")
    ax.set_title(title or f"{len(steps)} step(s): lanes busy over time; gaps are idle")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


@dataclass(frozen=True)
class SpeedupPoint:
    """One measured configuration for `plot_speedup`."""

    balance_ratio: float  # ρ = L/R, from measured stage times
    measured: float  # measured Sync wall / ThunderSync wall
    predicted: float | None = None  # trace-replay prediction (Eq. 14), if available
    label: str = ""  # e.g. the batch size or turn count, shown next to the point


def plot_speedup(points: Sequence[SpeedupPoint], path: str | Path,
                 curve: Sequence[tuple[float, float]] | None = None, title: str | None = None) -> Path:
    """Speedup over Sync vs. balance ratio ρ: measured (filled), trace-predicted (open), the 2× bound (Eq. 17) and
    the full-overlap limit (1 + ρ)/max(1, ρ) (§F.3).

    `curve` is a predicted line as (ρ, speedup) pairs, e.g. from `model.sweep`; without it the trace-predicted
    points are joined in order of ρ.
    """
    if not points:
        raise ValueError("plot_speedup needs at least one point")
    rhos = [p.balance_ratio for p in points]
    lo, hi = min(min(rhos), 0.25), max(max(rhos), 4.0)
    grid = [lo * (hi / lo) ** (k / 200) for k in range(201)]
    fig = new_figure((6.5, 4.2))
    ax = fig.subplots()
    ax.axhline(2.0, color="black", linestyle="--", linewidth=1, label="2× bound (Eq. 17)")
    ax.plot(grid, [full_overlap_limit(r) for r in grid], color="0.5", linestyle=":",
            label="(1+ρ)/max(1,ρ) limit")
    predicted = sorted((p.balance_ratio, p.predicted) for p in points if p.predicted is not None)
    line = list(curve) if curve is not None else predicted
    if line:
        ax.plot([x for x, _ in line], [y for _, y in line], color="tab:blue",
                label="model" if curve is not None else "trace replay (Eq. 14)")
    if predicted:
        ax.scatter([x for x, _ in predicted], [y for _, y in predicted], facecolors="none", edgecolors="tab:blue",
                   label="predicted (trace)", zorder=3)
    ax.scatter(rhos, [p.measured for p in points], color="tab:red", label="measured", zorder=4)
    for p in points:
        if p.label:
            ax.annotate(p.label, (p.balance_ratio, p.measured), textcoords="offset points", xytext=(4, -10),
                        fontsize=7)
    ax.set_xscale("log")
    ticks = [t for t in (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0) if lo <= t <= hi]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xticks([], minor=True)
    ax.set_xlabel("balance ratio ρ = L / R (learner service / rollout time)")
    ax.set_ylabel("speedup over Sync")
    ax.set_ylim(min(0.9, min(p.measured for p in points) - 0.05), 2.1)
    ax.set_title(title or "ThunderSync speedup vs. balance")
    ax.legend(fontsize=8, loc="best")  # "best" keeps the legend off the measured points
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path
