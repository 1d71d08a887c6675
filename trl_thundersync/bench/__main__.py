"""Benchmark: the same agentic GRPO workload under `sync`, `thundersync` and stock `trl.GRPOTrainer`.

    python -m trl_thundersync.bench --preset quick                 # < 5 min on 2 CPU cores, ρ ≈ 1, CV ≥ 0.5
    python -m trl_thundersync.bench --preset balance-sweep         # ρ ∈ {0.25, 0.5, 1, 2, 4} (Figure 7 shape)
    python -m trl_thundersync.bench --preset spread-sweep          # trajectory-duration CV ∈ {0, 0.25, 0.5, 1}
    python -m trl_thundersync.bench --preset model                 # rollout = real sampling on the other core
    python -m trl_thundersync.bench --balance 2 --latency-cv 1 --batch 32 --turns 3 --repeats 3 --name mine

Each run (one schedule, one repeat) is its own process (`bench.run_one`), so peak RSS is per schedule and runs
share no state; runs are interleaved (sync, thundersync, trl, sync, ...) so machine noise hits every schedule, and
the first step of every run is dropped as warm-up. Workload and knobs: `bench/workload.py`. With `--balance ρ` the
tool-latency mean is calibrated first: one short `sync` run without sleeps measures the learner's seconds per
trajectory and the fixed per-trajectory rollout overhead, then the seeded durations are replayed through the
rollout slots to find the mean that makes R ≈ L/ρ (the realized R, L and ρ of every run are reported).

Prints a table per point (mean step wall ± stdev, speedup vs sync, R, L, realized ρ, learner idle fraction, learner
tail, learner TFLOP/s and MFU with `--peak-flops`, peak RSS, gradient-statistics memory, CPU used by other
processes meanwhile) and the measured speedup next to the trace-replay prediction (paper Eq. 14 on the *sync*
traces: what ThunderSync should take given the sync run's release times and service times). Writes
`<out>.json`, `<out stem>-timeline.png` (one sync, one thundersync and one TRL step, side by side),
`<out stem>-trace.json` (the same steps for https://ui.perfetto.dev) and `<out stem>-speedup.png`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..trace.export import SpeedupPoint, plot_speedup, plot_timeline, read_jsonl, write_chrome_trace
from ..trace.model import Replay, predicted_vs_measured, replay, replay_step
from ..trace.records import StepTrace
from .workload import Workload, predicted_rollout, calibrated_latency_mean

SCHEDULES = ("sync", "thundersync", "trl")

# name -> (points, repeats, schedules). Sizes are chosen to fit the stated time on a 2-core CPU machine.
_BASE = Workload(name="quick", batch=16, group=4, turns=2, concurrency=4, latency_cv=0.6, balance=1.0,
                 hidden=192, layers=4, steps=4)


def presets() -> dict[str, tuple[list[Workload], int, tuple[str, ...]]]:
    return {
        "quick": ([_BASE], 2, SCHEDULES),
        "balance-sweep": ([_BASE.with_(name=f"rho={r:g}", balance=r) for r in (0.25, 0.5, 1.0, 2.0, 4.0)], 1,
                          ("sync", "thundersync")),
        "spread-sweep": ([_BASE.with_(name=f"cv={c:g}", latency_cv=c) for c in (0.0, 0.25, 0.5, 1.0)], 1,
                         ("sync", "thundersync")),
        "model": ([Workload(name="model", generator="model", batch=16, group=4, turns=1, concurrency=4,
                            max_new_tokens=48, hidden=192, layers=4, steps=4, balance=None, latency_cv=0.0,
                            latency_mean=0.0)], 1, SCHEDULES),
        "smoke": ([Workload(name="smoke", batch=4, group=2, turns=1, concurrency=2, latency_mean=0.02,
                            balance=None, hidden=32, layers=1, steps=2)], 1, SCHEDULES),
    }


# --- running -------------------------------------------------------------------------------------------------------


def _run_child(schedule: str, w: Workload, run_dir: Path, model_dir: Path) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = {"schedule": schedule, "workload": w.to_dict(), "out_dir": str(run_dir), "model_dir": str(model_dir),
            "result": str(run_dir / "result.json")}
    log = run_dir / "run.log"
    with log.open("w") as f:
        proc = subprocess.run([sys.executable, "-m", "trl_thundersync.bench.run_one", "--json-args", json.dumps(spec)],
                              stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"benchmark run {schedule} ({w.name}) failed with exit code {proc.returncode}; "
                         f"log {log}:\n{tail}")
    result = json.loads((run_dir / "result.json").read_text())
    result["log"] = str(log)
    return result


def _model_dir(work: Path, w: Workload) -> Path:
    return work / f"tiny-qwen3-h{w.hidden}-l{w.layers}"


def _calibration_key(w: Workload) -> str:
    return (f"h{w.hidden}-l{w.layers}-b{w.batch}-g{w.group}-t{w.turns}-q{w.concurrency}-d{w.gen_delay:g}-"
            f"s{w.seed}")


def calibrate(w: Workload, work: Path, cache: dict[str, dict]) -> dict:
    """Measure the learner's seconds per trajectory and the rollout's fixed costs (one sync run, no sleeps)."""
    key = _calibration_key(w)
    if key in cache:
        return cache[key]
    probe = w.with_(name=f"calibration-{key}", latency_mean=0.0, steps=3)
    started = time.perf_counter()
    print(f"calibrating {key}: one sync run without tool latency ...", flush=True)
    result = _run_child("sync", probe, work / "calibration" / key, _model_dir(work, w))
    steps = read_jsonl(result["trace"])[1:]
    reps = [replay_step(s) for s in steps]
    learner = statistics.mean(r.learner_service for r in reps) / w.batch
    durations = [e.end - e.start for s in steps for e in s.events if e.kind == "trajectory"]
    overhead = statistics.mean(durations)
    rollout = statistics.mean(r.rollout_end for r in reps)
    fixed = max(0.0, rollout - predicted_rollout(probe, 0.0, overhead, range(1, probe.steps)))
    cache[key] = {"learner_per_trajectory_s": learner, "overhead_per_trajectory_s": overhead,
                  "rollout_fixed_s": fixed, "rollout_without_latency_s": rollout,
                  "seconds": time.perf_counter() - started}
    print(f"  learner {learner * 1e3:.0f} ms/trajectory, rollout overhead {overhead * 1e3:.0f} ms/trajectory, "
          f"R without latency {rollout:.2f} s ({cache[key]['seconds']:.0f} s)", flush=True)
    return cache[key]


def resolve(w: Workload, work: Path, cache: dict[str, dict]) -> tuple[Workload, dict | None]:
    """Fill in the tool-latency mean from `balance` (calibrated) when it is not given."""
    if w.generator == "model" or w.latency_mean is not None:
        return (w.with_(latency_mean=w.latency_mean or 0.0), None)
    if not w.balance:
        raise SystemExit(f"{w.name}: give --latency-mean or --balance")
    cal = calibrate(w, work, cache)
    mean = calibrated_latency_mean(w, cal["learner_per_trajectory_s"], cal["overhead_per_trajectory_s"],
                                   cal["rollout_fixed_s"])
    return w.with_(latency_mean=round(mean, 4)), cal


# --- statistics -----------------------------------------------------------------------------------------------------


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def _stdev(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 and statistics.fmean(xs) > 0 else 0.0


def measured_steps(runs: list[dict]) -> list[tuple[float, StepTrace]]:
    """(callback step wall, trace) of every step but the first of each run."""
    out = []
    for run in runs:
        traces = read_jsonl(run["trace"])
        walls = [end - begin for begin, end in run["step_intervals"]]
        if len(traces) != len(walls):
            raise SystemExit(f"{run['log']}: {len(walls)} steps timed but {len(traces)} traced")
        out += list(zip(walls, traces))[1:]
    return out


def predict_thundersync(step: StepTrace) -> Replay:
    """What ThunderSync would take on this step's recorded work (paper Eq. 14), from a trace of any schedule.

    Items in their recorded service order, released at their recorded `ready` (a trajectory's backward: when its
    reward was known; TRL's whole-batch item: at R); a group fold depends only on its group's backwards, which precede it in that order, so it gets no
    release time of its own (in a `sync` trace its recorded `ready` is when sync *submitted* it, after R, which
    `replay_step` would wrongly take as a release time). R and the serial suffix P are the step's own.
    """
    learner = sorted((e for e in step.events if e.lane == "learner"), key=lambda e: (e.start, e.end))
    items = [((step.start if e.kind == "group_fold" or e.ready is None else e.ready), e.end - e.start)
             for e in learner]
    suffix = max(0.0, step.publish_end - max(step.rollout_end, step.learner_end))
    return replay(items, step.rollout_end, suffix, step.start)


def summarize(runs: list[dict], peak_flops: float | None) -> dict[str, Any]:
    steps = measured_steps(runs)
    traces = [t for _, t in steps]
    reps = [predict_thundersync(t) for t in traces]
    walls = [w for w, _ in steps]
    flops = [sum(e.flops for e in t.events) for t in traces]
    tflops = [f / t.wall / 1e12 for f, t in zip(flops, traces)]
    traj_cv = [_cv([e.end - e.start for e in t.events if e.kind == "trajectory"]) for t in traces]
    out = {
        "steps": len(steps),
        "step_wall_s": _mean(walls), "step_wall_stdev_s": _stdev(walls), "step_walls_s": walls,
        "trace_wall_s": _mean([t.wall for t in traces]),
        "rollout_s": _mean([r.rollout_end for r in reps]),
        "learner_busy_s": _mean([r.learner_service for r in reps]),
        "suffix_s": _mean([r.suffix for r in reps]),
        "balance_ratio": _mean([r.balance_ratio for r in reps]),
        "learner_tail_s": _mean([max(0.0, t.learner_end - t.rollout_end) for t in traces]),
        "learner_idle_fraction": _mean([max(0.0, 1 - r.learner_service / t.wall) for r, t in zip(reps, traces)]),
        "learner_tflops_per_s": _mean(tflops),
        "mfu": _mean([x * 1e12 / peak_flops for x in tflops]) if peak_flops else None,
        "stats_peak_mb": max((t.stats_bytes for t in traces), default=0) / 2**20,
        "trajectory_duration_cv": _mean(traj_cv),
        "peak_rss_mb": max(r["peak_rss_mb"]["self"] for r in runs),
        "peak_rss_with_children_mb": max(r["peak_rss_mb"]["total"] for r in runs),
        "cpu_cores_used": _mean([r["cpu_cores_used"] for r in runs]),
        "foreign_cpu_cores": _mean([r["foreign_cpu_cores"] for r in runs]),
        "replay_thundersync_s": _mean([r.thundersync_time for r in reps]),
        "replay_sync_s": _mean([r.sync_time for r in reps]),
    }
    if traces and traces[0].schedule in ("sync", "thundersync"):
        report = predicted_vs_measured(traces)
        out["replay_abs_error"] = report.mean_abs_relative_error
    return out


def compare(stats: dict[str, dict]) -> dict[str, Any]:
    """Speedups vs sync, and the measured ThunderSync speedup next to the replay prediction from the sync traces."""
    out: dict[str, Any] = {}
    sync = stats.get("sync")
    if sync is None:
        return out
    out["speedup"] = {name: sync["step_wall_s"] / s["step_wall_s"] for name, s in stats.items()}
    ts = stats.get("thundersync")
    if ts is not None:
        predicted = sync["replay_sync_s"] / sync["replay_thundersync_s"]
        measured = sync["trace_wall_s"] / ts["trace_wall_s"]
        out.update(predicted_speedup=predicted, measured_speedup_trace=measured,
                   measured_speedup_step=out["speedup"]["thundersync"],
                   prediction_gap=out["speedup"]["thundersync"] / predicted - 1.0)
    return out


# --- output -----------------------------------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def describe(w: Workload, cal: dict | None) -> str:
    if w.generator == "model":
        rollout = (f"embedded LocalProcessEngine sampling {w.max_new_tokens} tokens/turn, {w.concurrency} in flight, "
                   "1 torch thread")
    else:
        rollout = (f"{w.turns} sandboxed tool calls/trajectory, latency mean {w.latency_mean:.3f} s, CV "
                   f"{w.latency_cv:g}, {w.concurrency} slots")
        if cal is not None:
            rollout += f" (calibrated for ρ = {w.balance:g})"
    return (f"B={w.batch} G={w.group} steps={w.steps}, model {w.hidden}x{w.layers}, {rollout}")


def print_point(name: str, w: Workload, cal: dict | None, stats: dict[str, dict], cmp: dict) -> None:
    print(f"\n== {name}: {describe(w, cal)}")
    header = (f"{'schedule':<12} {'step s':>7} {'± sd':>6} {'speedup':>7} {'R s':>6} {'L s':>6} {'ρ=L/R':>6} "
              f"{'idle':>5} {'tail s':>6} {'TFLOP/s':>8} {'MFU':>6} {'RSS MB':>7} {'stats MB':>8} {'cores':>5} "
              f"{'other':>5}")
    print(header)
    for sched, s in stats.items():
        speed = cmp.get("speedup", {}).get(sched)
        print(f"{sched:<12} {s['step_wall_s']:>7.3f} {s['step_wall_stdev_s']:>6.3f} {_fmt(speed, '>6.2f')}x "
              f"{s['rollout_s']:>6.2f} {s['learner_busy_s']:>6.2f} {s['balance_ratio']:>6.2f} "
              f"{s['learner_idle_fraction']:>5.2f} {s['learner_tail_s']:>6.2f} "
              f"{s['learner_tflops_per_s']:>8.4f} {_fmt(s['mfu'], '>6.4f')} {s['peak_rss_mb']:>7.0f} "
              f"{s['stats_peak_mb']:>8.2f} {s['cpu_cores_used']:>5.2f} {s['foreign_cpu_cores']:>5.2f}")
    if "predicted_speedup" in cmp:
        ts = stats["thundersync"]
        print(f"thundersync vs sync: measured {cmp['measured_speedup_step']:.2f}x (step walls), "
              f"{cmp['measured_speedup_trace']:.2f}x (trace walls); predicted {cmp['predicted_speedup']:.2f}x "
              f"(replay of the sync traces, Eq. 14), gap {cmp['prediction_gap'] * 100:+.1f}%; replay error on "
              f"thundersync's own steps {ts.get('replay_abs_error', math.nan) * 100:.1f}%; trajectory-duration "
              f"CV {stats['sync']['trajectory_duration_cv']:.2f}")


def _shift(step: StepTrace, delta: float) -> StepTrace:
    events = tuple(replace(e, start=e.start + delta, end=e.end + delta,
                           ready=None if e.ready is None else e.ready + delta) for e in step.events)
    return replace(step, start=step.start + delta, rollout_end=step.rollout_end + delta,
                   learner_end=step.learner_end + delta, barrier_end=step.barrier_end + delta,
                   publish_end=step.publish_end + delta, events=events)


def side_by_side(runs: dict[str, list[dict]], gap: float = 0.5) -> list[StepTrace]:
    """The first measured step of each schedule's last run, placed one after another on one time axis."""
    out: list[StepTrace] = []
    cursor = 0.0
    for sched in SCHEDULES:
        if sched not in runs:
            continue
        traces = read_jsonl(runs[sched][-1]["trace"])
        step = traces[1] if len(traces) > 1 else traces[0]
        out.append(_shift(step, cursor - step.start))
        cursor = out[-1].publish_end + gap
    return out


def plot_spread(points: list[dict], path: Path) -> Path:
    """Speedup over Sync against the realized trajectory-duration CV (measured and replay-predicted)."""
    from matplotlib.figure import Figure

    rows = sorted((p["schedules"]["sync"]["trajectory_duration_cv"], p["compare"]["measured_speedup_step"],
                   p["compare"]["predicted_speedup"]) for p in points if "predicted_speedup" in p["compare"])
    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.subplots()
    ax.axhline(2.0, color="black", linestyle="--", linewidth=1, label="2× bound (Eq. 17)")
    ax.plot([r[0] for r in rows], [r[2] for r in rows], "o-", mfc="none", color="tab:blue",
            label="predicted (replay of sync traces)")
    ax.plot([r[0] for r in rows], [r[1] for r in rows], "o", color="tab:red", label="measured")
    ax.set_xlabel("trajectory-duration coefficient of variation (realized)")
    ax.set_ylabel("speedup over Sync")
    ax.set_ylim(min([0.9] + [r[1] - 0.05 for r in rows]), 2.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("ThunderSync speedup vs. trajectory-duration spread (ρ ≈ 1)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path


def machine() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"nproc": os.cpu_count(), "cpu": model, "memory_gib": round(mem, 1), "python": platform.python_version(),
            "platform": platform.platform()}


# --- command line ---------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(prog="python -m trl_thundersync.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(presets()), default=None,
                   help="a predefined point or sweep (default: quick, with any knob below overriding it)")
    p.add_argument("--name", help="output name (default: the preset's)")
    p.add_argument("--out", help="JSON path (default outputs/bench/<name>.json); plots are written beside it")
    p.add_argument("--work-dir", help="runs, traces and logs (default outputs/bench/<name>-runs)")
    p.add_argument("--repeats", type=int, help="runs per schedule (interleaved)")
    p.add_argument("--schedules", help="comma-separated subset of sync,thundersync,trl")
    p.add_argument("--peak-flops", type=float, help="peak FLOP/s of the learner's device (for MFU), e.g. 1e11")
    knobs = p.add_argument_group("workload knobs (override the preset; apply to every point)")
    knobs.add_argument("--steps", type=int, help="optimizer steps per run (the first is dropped)")
    knobs.add_argument("--batch", type=int, help="trajectories per step")
    knobs.add_argument("--group", type=int, help="GRPO group size")
    knobs.add_argument("--turns", type=int, help="tool calls per trajectory")
    knobs.add_argument("--concurrency", type=int, help="trajectories in flight (rollout slots)")
    knobs.add_argument("--balance", type=float, help="target ρ = L/R; calibrates the tool-latency mean")
    knobs.add_argument("--latency-mean", type=float, help="mean sandboxed sleep per tool call, s (no calibration)")
    knobs.add_argument("--latency-cv", type=float, help="CV of a trajectory's total tool latency")
    knobs.add_argument("--turn-jitter", type=float, help="CV of each turn's share of it")
    knobs.add_argument("--gen-delay", type=float, help="simulated decode seconds per turn")
    knobs.add_argument("--hidden", type=int, help="tiny model width (learner cost)")
    knobs.add_argument("--layers", type=int, help="tiny model depth (learner cost)")
    knobs.add_argument("--generator", choices=["scripted", "model"])
    knobs.add_argument("--max-new-tokens", type=int, help="tokens per turn (model generator)")
    knobs.add_argument("--seed", type=int)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    preset = args.preset or "quick"
    points, repeats, schedules = presets()[preset]
    overrides = {k: getattr(args, k) for k in ("steps", "batch", "group", "turns", "concurrency", "balance",
                                               "latency_mean", "latency_cv", "turn_jitter", "gen_delay", "hidden",
                                               "layers", "generator", "max_new_tokens", "seed")
                 if getattr(args, k) is not None}
    if "latency_mean" in overrides and "balance" not in overrides:
        overrides["balance"] = None
    if "balance" in overrides and "latency_mean" not in overrides:
        overrides["latency_mean"] = None
    points = [w.with_(**overrides) for w in points]
    repeats = args.repeats or repeats
    if args.schedules:
        schedules = tuple(s.strip() for s in args.schedules.split(","))
        unknown = set(schedules) - set(SCHEDULES)
        if unknown:
            raise SystemExit(f"unknown schedules {sorted(unknown)}; choose from {SCHEDULES}")
    name = args.name or (preset if not overrides else f"{preset}-custom")
    out = Path(args.out or f"outputs/bench/{name}.json")
    work = Path(args.work_dir or out.with_name(f"{out.stem}-runs"))
    work.mkdir(parents=True, exist_ok=True)
    cache_path = work / "calibration.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    command = "python -m trl_thundersync.bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                          else sys.argv[1:]))
    started = time.perf_counter()
    print(f"{command}\n{len(points)} point(s) × {repeats} repeat(s) × {', '.join(schedules)}; work dir {work}",
          flush=True)

    resolved = []
    for w in points:
        w, cal = resolve(w, work, cache)
        resolved.append((w, cal))
        cache_path.write_text(json.dumps(cache, indent=1))
    total, done = len(resolved) * repeats * len(schedules), 0
    results = []
    for w, cal in resolved:
        runs: dict[str, list[dict]] = {s: [] for s in schedules}
        for r in range(repeats):
            for sched in schedules:
                done += 1
                result = _run_child(sched, w, work / w.name / f"{sched}-{r}", _model_dir(work, w))
                runs[sched].append(result)
                walls = [b - a for a, b in result["step_intervals"][1:]]
                print(f"[{done}/{total}] {w.name} {sched:<11} repeat {r + 1}: {len(walls)} measured steps, mean "
                      f"{_mean(walls):.2f} s, run {result['run_seconds']:.0f} s, other processes "
                      f"{result['foreign_cpu_cores']:.2f} cores  (elapsed {time.perf_counter() - started:.0f} s)",
                      flush=True)
        stats = {s: summarize(runs[s], args.peak_flops) for s in schedules}
        cmp = compare(stats)
        results.append({"name": w.name, "workload": w.to_dict(), "calibration": cal, "schedules": stats,
                        "compare": cmp, "runs": runs})
        print_point(w.name, w, cal, stats, cmp)

    files: dict[str, str] = {}
    focus = min(results, key=lambda p: abs(math.log(p["schedules"].get("sync", {}).get("balance_ratio", 1.0) or 1.0)))
    steps = side_by_side(focus["runs"])
    files["timeline_png"] = str(plot_timeline(steps, out.with_name(f"{out.stem}-timeline.png"),
                                              title=f"{focus['name']}: one step each of " +
                                              ", ".join(s.schedule for s in steps) + " (same trajectories)"))
    files["chrome_trace"] = str(write_chrome_trace(steps, out.with_name(f"{out.stem}-trace.json")))
    speed_points = [SpeedupPoint(balance_ratio=p["schedules"]["sync"]["balance_ratio"],
                                 measured=p["compare"]["measured_speedup_step"],
                                 predicted=p["compare"]["predicted_speedup"], label=p["name"])
                    for p in results if "predicted_speedup" in p["compare"]]
    if speed_points:
        files["speedup_png"] = str(plot_speedup(speed_points, out.with_name(f"{out.stem}-speedup.png"),
                                                title=f"ThunderSync speedup over Sync ({name})"))
    if preset == "spread-sweep" and len(speed_points) > 1:
        files["spread_png"] = str(plot_spread(results, out.with_name(f"{out.stem}-spread.png")))
    files["json"] = str(out)
    report = {"command": command, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "machine": machine(), "preset": preset, "repeats": repeats, "schedules": list(schedules),
              "points": results, "files": files, "seconds": time.perf_counter() - started}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {', '.join(files.values())}  ({report['seconds']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
