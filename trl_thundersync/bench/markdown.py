"""Render benchmark reports (the JSON `python -m trl_thundersync.bench` writes) as Markdown tables.

    python -m trl_thundersync.bench.markdown outputs/bench/quick.json outputs/bench/balance-sweep.json
    python -m trl_thundersync.bench.markdown --from-traces outputs/bench/quick.json   # re-summarize the raw traces

Two tables per report: every (point, schedule) with its step time, stage times and memory; and per point, sync vs
thundersync measured next to the replay prediction. This is how the tables in BENCHMARKS.md are produced.
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
        sync, ts = st["sync"], st["thundersync"]
        noise = (sync["foreign_cpu_cores"] + ts["foreign_cpu_cores"]) / 2
        lines.append(f"| {point['name']} | {sync['balance_ratio']:.2f} | {sync['trajectory_duration_cv']:.2f} | "
                     f"{sync['step_wall_s']:.2f} | {ts['step_wall_s']:.2f} | {c['measured_speedup_step']:.2f}× | "
                     f"{c['predicted_speedup']:.2f}× | {c['prediction_gap']:+.1%} | "
                     f"{ts['learner_idle_fraction']:.0%} | "
                     f"{ts['learner_busy_s'] / sync['learner_busy_s'] - 1:+.0%}, "
                     f"{ts['rollout_s'] / sync['rollout_s'] - 1:+.0%} | {_ms(ts.get('backward_during_rollout_s'))} / "
                     f"{_ms(ts.get('backward_after_rollout_s'))} | {noise:.2f} |")
    return "\n".join(lines)


def resummarize(report: dict[str, Any]) -> dict[str, Any]:
    """The report with every point's schedule summaries and comparison recomputed from its runs' traces."""
    from .__main__ import load_run
    from .stats import compare, summarize

    points = []
    for point in report["points"]:
        stats = {name: summarize([load_run(r) for r in runs]) for name, runs in point["runs"].items()}
        points.append({**point, "schedules": {k: v.to_dict() for k, v in stats.items()},
                       "compare": compare(stats).to_dict()})
    return {**report, "points": points}


def render(report: dict[str, Any]) -> str:
    header = f"`{report['command']}` — {report['date']}, {report['seconds']:.0f} s"
    return "\n\n".join([header, schedule_table(report), prediction_table(report)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="JSON reports of python -m trl_thundersync.bench")
    parser.add_argument("--from-traces", action="store_true", help="recompute the summaries from the step traces")
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.reports]
    if args.from_traces:
        reports = [resummarize(r) for r in reports]
    print("\n\n".join(render(r) for r in reports))


if __name__ == "__main__":
    main()
