"""Render benchmark reports (the JSON `python -m benchmarks` writes) as Markdown tables.

    python -m benchmarks.markdown outputs/bench/quick.json outputs/bench/balance-sweep.json
    python -m benchmarks.markdown --from-traces outputs/bench/quick.json   # re-summarize the raw traces

Tables per report: every (point, schedule) with its step time, stage times and memory; per point, sync vs
thundersync measured next to the replay prediction; with several release points, each ThunderSync schedule's measured
speedup next to its release point's replay predictions and its tail; and the overlap cost per side. This is how the
tables in BENCHMARKS.md are produced.
`--from-traces` recomputes the summaries from the runs' step traces (kept in the work dir) with this version's
`bench.stats`, instead of reading the summaries stored in the report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _x(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.0f}"


def schedule_table(report: dict[str, Any]) -> str:
    """Every schedule of every point: step wall, speedup, R, L, ρ, idle, tail, memory, machine noise."""
    lines = ["| point | schedule | step s (± sd) | speedup vs sync | R s | L s | ρ = L/R | learner idle | tail s | "
             "peak RSS MB | stats MB | other CPU (cores) |", "|" + "---|" * 12]
    for point in report["points"]:
        speedup = point["compare"]["speedup"]
        for name, s in point["schedules"].items():
            stats_mb = "–" if name == "trl" else _x(s["stats_peak_mb"], 1)
            lines.append(f"| {point['name']} | {name} | {s['step_wall_s']:.2f} ± {s['step_wall_stdev_s']:.2f} | "
                         f"{_x(speedup.get(name))}× | {s['rollout_s']:.2f} | {s['learner_busy_s']:.2f} | "
                         f"{s['balance_ratio']:.2f} | {s['learner_idle_fraction']:.0%} | {s['learner_tail_s']:.2f} | "
                         f"{s['peak_rss_mb']:.0f} | {stats_mb} | {s['foreign_cpu_cores']:.2f} |")
    return "\n".join(lines)


def prediction_table(report: dict[str, Any]) -> str:
    """Per point: realized ρ and duration CV, measured vs replay-predicted ThunderSync speedup, learner idle, and
    how much slower L and R were in the thundersync runs than in the sync runs (contention while overlapping)."""
    lines = ["| point | ρ = L/R (sync) | duration CV | sync step s | thundersync step s | measured speedup | "
             "predicted (Eq. 14 replay) | gap | thundersync learner idle | L, R under overlap vs sync | "
             "backward ms during / after R | other CPU (cores) |", "|" + "---|" * 12]
    for point in report["points"]:
        c, st = point["compare"], point["schedules"]
        if c["predicted_speedup"] is None:
            continue
        sync, ts = st["sync"], st[c.get("primary") or "thundersync"]
        noise = (sync["foreign_cpu_cores"] + ts["foreign_cpu_cores"]) / 2
        lines.append(f"| {point['name']} | {sync['balance_ratio']:.2f} | {sync['trajectory_duration_cv']:.2f} | "
                     f"{sync['step_wall_s']:.2f} | {ts['step_wall_s']:.2f} | {c['measured_speedup_step']:.2f}× | "
                     f"{c['predicted_speedup']:.2f}× | {c['prediction_gap']:+.1%} | "
                     f"{ts['learner_idle_fraction']:.0%} | "
                     f"{ts['learner_busy_s'] / sync['learner_busy_s'] - 1:+.0%}, "
                     f"{ts['rollout_s'] / sync['rollout_s'] - 1:+.0%} | {_ms(ts.get('backward_during_rollout_s'))} / "
                     f"{_ms(ts.get('backward_after_rollout_s'))} | {noise:.2f} |")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.0%}"


def _paired(slowdown: dict[str, Any], digits: int) -> str:
    """'+23% (+49 ms)' from a PairedSlowdown dict, '–' without pairs."""
    if slowdown.get("relative") is None:
        return "–"
    return f"{slowdown['relative']:+.0%} ({slowdown['seconds'] * 1e3:+.{digits}f} ms)"


def release_table(report: dict[str, Any]) -> str | None:
    """Per point and ThunderSync schedule (one per release point): measured speedup vs sync, the Eq. 14 replay
    prediction of its release point from the sync traces and from the reward-release traces, the gap, the learner
    tail (s and share of the step). None when no point has release points."""
    lines = ["| point | schedule | step s | measured speedup | predicted from sync trace | predicted from reward-"
             "release trace | gap | learner tail s | tail / step | learner idle |", "|" + "---|" * 10]
    rows = 0
    for point in report["points"]:
        c, st = point["compare"], point["schedules"]
        for name, predicted in (c.get("predicted_from_sync") or {}).items():
            s = st[name]
            from_reward = (c.get("predicted_from_reward") or {}).get(name)
            lines.append(f"| {point['name']} | {name} | {s['step_wall_s']:.2f} | {c['speedup'][name]:.2f}× | "
                         f"{predicted:.2f}× | {_x(from_reward)}{'' if from_reward is None else '×'} | "
                         f"{c['prediction_gaps'][name]:+.1%} | {s['learner_tail_s']:.2f} | "
                         f"{s['learner_tail_s'] / s['step_wall_s']:.1%} | {s['learner_idle_fraction']:.0%} |")
            rows += 1
    return "\n".join(lines) if rows else None


def mode_table(report: dict[str, Any]) -> str | None:
    """Per point: the predicted speedup over sync of every release mode (reward, content, turn), replaying the sync
    traces and the reward-release traces (whether or not that mode was run). None for reports without it."""
    lines = ["| point | trace replayed | reward release | content release | turn release |", "|" + "---|" * 5]
    rows = 0
    for point in report["points"]:
        for name in ("sync", "thundersync", "thundersync:reward"):
            s = point["schedules"].get(name)
            if s is None or not s.get("replay_release_s"):
                continue
            modes = {m: s["replay_sync_s"] / t for m, t in s["replay_release_s"].items()}
            lines.append(f"| {point['name']} | {name} | {_x(modes.get('reward'))}× | {_x(modes.get('content'))}× | "
                         f"{_x(modes.get('turn'))}× |")
            rows += 1
    return "\n".join(lines) if rows else None


def overlap_table(report: dict[str, Any]) -> str | None:
    """Per point and schedule, the overlap cost on each side (benchmarks/stats.py): median backward during / after R and
    the paired slowdown of backwards run before R vs the same trajectory's in sync; median rollout turn and tool
    call with the learner busy / idle, and the busy ones vs the same work in sync. None for reports without it."""
    lines = ["| point | schedule | backward ms during / after R | backward vs sync | turn ms busy / idle (n) | "
             "busy turn vs sync | tool ms busy / idle (n) | busy tool vs sync |", "|" + "---|" * 8]
    rows = 0
    for point in report["points"]:
        overlap = point["compare"].get("overlap_vs_sync")
        if overlap is None:
            continue
        for name, s in point["schedules"].items():
            vs = overlap.get(name, {})
            bwd, turn, tool = (vs.get(k, {}) for k in ("backward_during_vs_sync", "turn_busy_vs_sync",
                                                        "tool_busy_vs_sync"))
            lines.append(
                f"| {point['name']} | {name} | {_ms(s.get('backward_during_rollout_s'))} / "
                f"{_ms(s.get('backward_after_rollout_s'))} | {_pct(bwd.get('relative'))} | "
                f"{_x(None if s.get('turn_busy_s') is None else s['turn_busy_s'] * 1e3, 1)} / "
                f"{_x(None if s.get('turn_idle_s') is None else s['turn_idle_s'] * 1e3, 1)} "
                f"({s.get('turn_busy_n', 0)} / {s.get('turn_idle_n', 0)}) | {_paired(turn, 1)} | "
                f"{_ms(s.get('tool_busy_s'))} / {_ms(s.get('tool_idle_s'))} "
                f"({s.get('tool_busy_n', 0)} / {s.get('tool_idle_n', 0)}) | {_paired(tool, 0)} |")
            rows += 1
    return "\n".join(lines) if rows else None


def resummarize(report: dict[str, Any]) -> dict[str, Any]:
    """The report with every point's schedule summaries and comparison recomputed from its runs' traces."""
    from .__main__ import load_run
    from .stats import compare, summarize

    points = []
    for point in report["points"]:
        loaded = {name: [load_run(r) for r in runs] for name, runs in point["runs"].items()}
        stats = {name: summarize(runs) for name, runs in loaded.items()}
        traces = {name: [t for r in runs for t in r.traces] for name, runs in loaded.items()}
        points.append({**point, "schedules": {k: v.to_dict() for k, v in stats.items()},
                       "compare": compare(stats, traces).to_dict()})
    return {**report, "points": points}


def render(report: dict[str, Any]) -> str:
    header = f"`{report['command']}` — {report['date']}, {report['seconds']:.0f} s"
    tables = [schedule_table(report), prediction_table(report), release_table(report), mode_table(report),
              overlap_table(report)]
    return "\n\n".join([header] + [t for t in tables if t])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="JSON reports of python -m benchmarks")
    parser.add_argument("--from-traces", action="store_true", help="recompute the summaries from the step traces")
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.reports]
    if args.from_traces:
        reports = [resummarize(r) for r in reports]
    print("\n\n".join(render(r) for r in reports))


if __name__ == "__main__":
    main()
