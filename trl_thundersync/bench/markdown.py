"""Render benchmark reports (the JSON `python -m trl_thundersync.bench` writes) as Markdown tables.

    python -m trl_thundersync.bench.markdown outputs/bench/quick.json outputs/bench/balance-sweep.json

One table per report: a row per (point, schedule) for single points, a row per point (sync vs thundersync,
measured and predicted) for sweeps. This is how the tables in BENCHMARKS.md are produced.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _x(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


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
             "other CPU (cores) |", "|" + "---|" * 11]
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
                     f"{ts['rollout_s'] / sync['rollout_s'] - 1:+.0%} | "
                     f"{noise:.2f} |")
    return "\n".join(lines)


def render(report: dict[str, Any]) -> str:
    header = f"`{report['command']}` — {report['date']}, {report['seconds']:.0f} s"
    return "\n\n".join([header, schedule_table(report), prediction_table(report)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="JSON reports of python -m trl_thundersync.bench")
    args = parser.parse_args(argv)
    print("\n\n".join(render(json.loads(path.read_text())) for path in args.reports))


if __name__ == "__main__":
    main()
