"""Benchmark: the same agentic GRPO workload under `sync`, `thundersync` and stock `trl.GRPOTrainer`.

    python -m benchmarks --preset quick                 # ~5 min on 2 CPU cores, ρ ≈ 1, CV 0.6
    python -m benchmarks --preset quick --pin           # learner on one core, rollout on the other
    python -m benchmarks --preset balance-sweep         # ρ ∈ {0.25, 0.5, 1, 2, 4} (Figure 7 shape)
    python -m benchmarks --preset spread-sweep          # trajectory-duration CV ∈ {0 … 1.5}
    python -m benchmarks --preset quick-grading         # + 1.2 s grading; reward vs content release
    python -m benchmarks --preset quick --release reward,content,turn --grading-latency 2
    python -m benchmarks --balance 2 --latency-cv 1 --batch 32 --turns 3 --repeats 3 --name mine
    python -m benchmarks --preset thermostat-vllm       # real generation, the main job's workload (~30 min)

`--preset thermostat-vllm` is not a synthetic point: it runs `python -m benchmarks.realgen --workload thermostat`
(`benchmarks/realgen.py`) with stock TRL, sync and thundersync on the embedded server, and sync and thundersync on
managed vLLM servers (`rollout_engine="managed_vllm"`), interleaved, 2 repeats of 5 steps; `--repeats`, `--steps`,
`--schedules`, `--seed`, `--out`, `--work-dir` and `--rollout-engine` pass through, the synthetic knobs do not apply.
`--rollout-engine` applies to such realgen presets only (the synthetic points script their generation).

Each run (one schedule, one repeat) is its own process (`bench.run_one`), so peak RSS is per schedule and runs
share no state; runs are interleaved (sync, thundersync, trl, sync, ...) so machine noise hits every schedule, and
the first step of every run is dropped as warm-up. `--release reward,content` replaces the ThunderSync schedule by
one per GRPO release point (`thundersync:reward`, `thundersync:content`, ...: `ThunderSyncGRPOConfig.release`);
`--grading-latency g` makes every trajectory's reward take ~g s of verification after its last turn. Workload and
knobs: `benchmarks/workload.py`. With `--balance ρ` the tool-latency mean is calibrated first
(`benchmarks/calibration.py`, one short `sync` probe without sleeps).

Prints a table per point (mean step wall ± stdev, speedup vs sync, R, L, realized ρ, learner idle fraction, learner
tail, learner TFLOP/s and MFU with `--peak-flops`, peak RSS, gradient-statistics memory, CPU used by this run and by
other processes meanwhile), the CPU seconds and preemptions per step of the thread that runs `training_step` beside L (a
learner that computed longer vs one that waited for its core), the measured speedup of every ThunderSync schedule next
to the trace-replay prediction of its release point (paper Eq. 14 on the *sync* traces, and on the reward-release
traces), and the overlap cost per side (backward during vs after R, rollout turns and tool calls with the learner busy
vs idle, and vs sync). Writes `<out>.json`, `<stem>-timeline.png` (one step of each schedule, side by side),
`<stem>-trace.json` (the same steps for https://ui.perfetto.dev), `<stem>-speedup.png` and, for the spread sweep,
`<stem>-spread.png`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from trl_thundersync.trace.export import SpeedupPoint, plot_speedup, plot_timeline, read_jsonl, write_chrome_trace
from trl_thundersync.trace.model import RELEASE_MODES

from .calibration import Calibration, calibrated_latency_mean, calibration_from_probe
from .child import spawn_run
from .report import SpreadPoint, describe, plot_spread, print_overlap, print_point, write_report
from .stats import RunSteps, compare, measured_run, side_by_side, summarize, thundersync_schedules
from .workload import Workload, split_schedule

SCHEDULES = ("sync", "thundersync", "trl")

# Quick point: all 32 trajectories of a step in flight at once (one rollout wave, as on a rollout server with enough
# slots; R is the slowest trajectory), ρ ≈ 1, duration CV 0.6. Sizes fit the stated times on 2 CPU cores.
_QUICK = Workload(name="quick", batch=32, group=4, turns=2, concurrency=32, latency_cv=0.6, balance=1.0,
                  hidden=192, layers=4, steps=3)


def presets() -> dict[str, tuple[list[Workload], int, tuple[str, ...]]]:
    """name → (points, repeats, schedules)."""
    return {
        "quick": ([_QUICK], 2, SCHEDULES),
        "balance-sweep": ([_QUICK.with_(name=f"rho={r:g}", balance=r) for r in (0.25, 0.5, 1.0, 2.0, 4.0)], 1,
                          ("sync", "thundersync")),
        # R is the slowest trajectory, so the spread decides how early the learner gets work.
        "spread-sweep": ([_QUICK.with_(name=f"cv={c:g}", latency_cv=c)
                          for c in (0.0, 0.25, 0.5, 1.0, 1.5)], 1, ("sync", "thundersync")),
        # The issue-10 point: quick plus 1.2 s mean grading per trajectory (about a third of R here), reward vs content.
        "quick-grading": ([_QUICK.with_(name="quick-grading", grading_latency=1.2)], 2,
                          ("sync", "thundersync:reward", "thundersync:content", "trl")),
        "smoke": ([Workload(name="smoke", batch=4, group=2, turns=1, concurrency=2, latency_mean=0.02,
                            balance=None, hidden=32, layers=1, steps=2)], 1, SCHEDULES),
    }


# Presets that run `benchmarks.realgen` (real generation) instead of a synthetic point: name → its arguments.
REALGEN_PRESETS: dict[str, tuple[str, ...]] = {
    "thermostat-vllm": ("--workload", "thermostat", "--schedules",
                        "trl,sync@embedded,thundersync@embedded,sync@vllm,thundersync@vllm", "--steps", "5",
                        "--repeats", "2"),
}


def realgen_argv(preset: str, args: argparse.Namespace) -> list[str]:
    """The `benchmarks.realgen` command line of a realgen preset, with the options that apply to it passed through
    (given ones replace the preset's)."""
    argv = list(REALGEN_PRESETS[preset])
    given = {"--repeats": args.repeats, "--steps": args.steps, "--seed": args.seed, "--out": args.out,
             "--work-dir": args.work_dir, "--rollout-engine": args.rollout_engine,
             "--schedules": ",".join(args.schedules) if args.schedules else None}
    for flag, value in given.items():
        if value is None:
            continue
        if flag in argv:
            argv[argv.index(flag) + 1] = str(value)
        else:
            argv += [flag, str(value)]
    return argv


# --- running -------------------------------------------------------------------------------------------------------


def run_child(schedule: str, w: Workload, run_dir: Path, model_dir: Path, pin: bool) -> dict[str, Any]:
    """One run in its own process; returns run_one's result JSON (with the log path)."""
    spec = {"schedule": schedule, "workload": w.to_dict(), "out_dir": str(run_dir), "model_dir": str(model_dir),
            "result": str(run_dir / "result.json"), "pin": pin}
    return spawn_run("benchmarks.run_one", "--json-args", spec, run_dir, "run.log",
                     f"benchmark run {schedule} ({w.name})")


def load_run(result: dict[str, Any]) -> RunSteps:
    walls = [end - begin for begin, end in result["step_intervals"]]
    try:
        return measured_run(walls, read_jsonl(result["trace"]), result)
    except ValueError as err:
        raise SystemExit(f"{result['log']}: {err}") from err


def _model_dir(work: Path, w: Workload) -> Path:
    return work / f"tiny-qwen3-h{w.hidden}-l{w.layers}"


def _calibration_key(w: Workload, pin: bool) -> str:
    return (f"h{w.hidden}-l{w.layers}-b{w.batch}-g{w.group}-t{w.turns}-q{w.concurrency}-d{w.gen_delay:g}-"
            f"s{w.seed}{'-pinned' if pin else ''}")


def calibrate(w: Workload, work: Path, cache: dict[str, dict], pin: bool) -> Calibration:
    """Probe the learner cost and rollout overhead of `w` (cached per shape in the work dir)."""
    key = _calibration_key(w, pin)
    if key not in cache:
        probe = w.with_(name=f"calibration-{key}", latency_mean=0.0, grading_latency=0.0, steps=3)
        started = time.perf_counter()
        print(f"calibrating {key}: one sync run without tool latency ...", flush=True)
        result = run_child("sync", probe, work / "calibration" / key, _model_dir(work, w), pin)
        cal = calibration_from_probe(probe, read_jsonl(result["trace"])[1:])
        cache[key] = cal.to_dict()
        print(f"  learner {cal.learner_per_trajectory_s * 1e3:.0f} ms/trajectory, rollout overhead "
              f"{cal.overhead_per_trajectory_s * 1e3:.0f} ms/trajectory, R without latency "
              f"{cal.rollout_without_latency_s:.2f} s ({time.perf_counter() - started:.0f} s)", flush=True)
    return Calibration(**cache[key])


def resolve(w: Workload, work: Path, cache: dict[str, dict], pin: bool) -> tuple[Workload, Calibration | None]:
    """Fill in the tool-latency mean from `balance` (calibrated) when it is not given."""
    if w.latency_mean is not None:
        return w, None
    if not w.balance:
        raise SystemExit(f"{w.name}: give --latency-mean or --balance")
    cal = calibrate(w, work, cache, pin)
    mean = calibrated_latency_mean(w, cal.learner_per_trajectory_s, cal.overhead_per_trajectory_s,
                                   cal.rollout_fixed_s)
    return w.with_(latency_mean=round(mean, 4)), cal


def run_point(w: Workload, schedules: tuple[str, ...], repeats: int, work: Path, pin: bool,
              progress: tuple[int, int], started: float) -> dict[str, list[dict[str, Any]]]:
    """Every schedule `repeats` times, interleaved; returns the result JSONs per schedule."""
    done, total = progress
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in schedules}
    for r in range(repeats):
        for schedule in schedules:
            done += 1
            run_dir = work / w.name / f"{schedule.replace(':', '-')}-{r}"
            result = run_child(schedule, w, run_dir, _model_dir(work, w), pin)
            runs[schedule].append(result)
            walls = [b - a for a, b in result["step_intervals"][1:]]
            print(f"[{done}/{total}] {w.name} {schedule:<19} repeat {r + 1}: {len(walls)} measured steps, mean "
                  f"{sum(walls) / len(walls):.2f} s, run {result['run_seconds']:.0f} s, other processes "
                  f"{result['foreign_cpu_cores']:.2f} cores  (elapsed {time.perf_counter() - started:.0f} s)",
                  flush=True)
    return runs


# --- outputs -------------------------------------------------------------------------------------------------------


def write_plots(points: list[dict[str, Any]], out: Path, name: str, preset: str) -> dict[str, str]:
    """Timeline + Chrome trace of the point closest to balance, speedup plot, spread plot for the spread sweep."""
    files: dict[str, str] = {}
    focus = min(points, key=lambda p: abs(math.log(p["schedules"].get("sync", {}).get("balance_ratio", 1.0) or 1.0)))
    steps = []
    for schedule, runs in focus["runs"].items():
        traces = read_jsonl(runs[-1]["trace"])
        steps.append(dataclasses.replace(traces[1] if len(traces) > 1 else traces[0], schedule=schedule))
    steps = side_by_side(steps)
    title = f"{focus['name']}: one step each of {', '.join(s.schedule for s in steps)} (same trajectories)"
    files["timeline_png"] = str(plot_timeline(steps, out.with_name(f"{out.stem}-timeline.png"), title=title))
    files["chrome_trace"] = str(write_chrome_trace(steps, out.with_name(f"{out.stem}-trace.json")))
    compared = [p for p in points if p["compare"]["predicted_speedup"] is not None]
    if compared:
        speed = []
        for p in compared:
            c, rho = p["compare"], p["schedules"]["sync"]["balance_ratio"]
            names = thundersync_schedules(list(p["schedules"]))
            if len(names) <= 1:
                speed.append(SpeedupPoint(balance_ratio=rho, measured=c["measured_speedup_step"],
                                          predicted=c["predicted_speedup"], label=p["name"]))
                continue
            for n in names:  # one point per release point
                speed.append(SpeedupPoint(balance_ratio=rho, measured=c["speedup"][n],
                                          predicted=(c.get("predicted_from_sync") or {}).get(n),
                                          label=f"{p['name']} {n.partition(':')[2] or 'reward'}"))
        files["speedup_png"] = str(plot_speedup(speed, out.with_name(f"{out.stem}-speedup.png"),
                                                title=f"ThunderSync speedup over Sync ({name})"))
    if preset == "spread-sweep" and len(compared) > 1:
        spread = [SpreadPoint(p["schedules"]["sync"]["trajectory_duration_cv"], p["compare"]["measured_speedup_step"],
                              p["compare"]["predicted_speedup"]) for p in compared]
        files["spread_png"] = str(plot_spread(spread, out.with_name(f"{out.stem}-spread.png")))
    return files


# --- command line ---------------------------------------------------------------------------------------------------

_KNOBS = ("steps", "batch", "group", "turns", "concurrency", "balance", "latency_mean", "latency_cv", "turn_jitter",
          "gen_delay", "grading_latency", "grading_cv", "reward_scope", "shared_prefix", "batch_members",
          "adaptive_turns", "sandbox", "hidden", "layers", "seed")


def with_releases(schedules: tuple[str, ...], releases: tuple[str, ...] | None) -> tuple[str, ...]:
    """Replace the ThunderSync schedule(s) by one `thundersync:<release>` per release point, where the first stood
    (after sync when there was none); without `releases`, `schedules` unchanged."""
    if not releases:
        return schedules
    out: list[str] = []
    added = [f"thundersync:{r}" for r in releases]
    for s in schedules:
        if s.partition(":")[0] == "thundersync":
            out += [a for a in added if a not in out]
        elif s not in out:
            out.append(s)
    if not any(a in out for a in added):
        at = out.index("sync") + 1 if "sync" in out else 0
        out[at:at] = added
    return tuple(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted([*presets(), *REALGEN_PRESETS]), default=None,
                   help="a predefined point or sweep (default: quick, with any knob below overriding it); "
                        "thermostat-vllm runs benchmarks.realgen on the main job's workload (see above)")
    p.add_argument("--rollout-engine", help="realgen presets: rollout_engine of the schedules that do not name one "
                   "(auto, embedded_server, managed_vllm, ...; vllm / embedded for short)")
    p.add_argument("--name", help="output name (default: the preset's)")
    p.add_argument("--out", help="JSON path (default outputs/bench/<name>.json); plots are written beside it")
    p.add_argument("--work-dir", help="runs, traces and logs (default <out stem>-runs beside the JSON)")
    p.add_argument("--repeats", type=int, help="runs per schedule (interleaved)")
    p.add_argument("--schedules", help="comma-separated subset of sync,thundersync,trl (or thundersync:<release>)")
    p.add_argument("--release", help="comma-separated GRPO release points, e.g. reward,content,turn: one ThunderSync "
                   "schedule per point (thundersync:<release>) instead of the plain one")
    p.add_argument("--peak-flops", type=float, help="peak FLOP/s of the learner's device (for MFU), e.g. 1e11")
    p.add_argument("--pin", action="store_true",
                   help="pin the learner thread to one CPU and the rollout side (agent loops, tools, sandboxes) to "
                        "the others; needs ≥ 2 CPUs")
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
    knobs.add_argument("--grading-latency", type=float,
                       help="mean seconds of verification after a trajectory's last turn before its reward is known")
    knobs.add_argument("--grading-cv", type=float, help="CV of the grading time between trajectories")
    knobs.add_argument("--reward-scope", choices=("auto", "trajectory", "group", "batch"),
                       help="ThunderSyncGRPOConfig.reward_scope of the ThunderSync schedules (stock TRL: always batch)")
    knobs.add_argument("--shared-prefix", type=lambda v: {"on": True, "off": False}[v], metavar="{on,off}",
                       help="sync and ThunderSync schedules: 'on' shares every group's prompt whatever its length "
                            "(shared_prefix_min_prompt_tokens=1), 'off' none (default: the config's rule)")
    knobs.add_argument("--batch-members", type=lambda v: {"on": True, "off": False}[v], metavar="{on,off}",
                       help="sync and ThunderSync schedules: batch_group_members (a group's last members, ready "
                            "together, in padded passes; default: the config's, on)")
    knobs.add_argument("--adaptive-turns", type=lambda v: {"on": True, "off": False}[v], metavar="{on,off}",
                       help="thundersync:turn: adaptive_turn_release (a step after one the learner bounded runs as "
                            "content release; default: the config's, on)")
    knobs.add_argument("--sandbox", type=lambda v: {"on": True, "off": False}[v], metavar="{on,off}",
                       help="'off': tool calls sleep their latency in-process and return what the sandboxed command "
                            "prints, so no CPU goes to sandboxes (their share of the overlap's cost; default on)")
    knobs.add_argument("--hidden", type=int, help="tiny model width (learner cost)")
    knobs.add_argument("--layers", type=int, help="tiny model depth (learner cost)")
    knobs.add_argument("--seed", type=int)
    args = p.parse_args(argv)
    if args.preset in REALGEN_PRESETS:
        if args.schedules:
            args.schedules = tuple(s.strip() for s in args.schedules.split(","))
        return args  # realgen checks its own arguments
    if args.rollout_engine is not None:
        p.error("--rollout-engine applies to the realgen presets (e.g. thermostat-vllm); the synthetic points script "
                "their generation")
    if args.schedules:
        args.schedules = tuple(s.strip() for s in args.schedules.split(","))
        for name in args.schedules:
            try:
                split_schedule(name)
            except ValueError:
                p.error(f"--schedules: unknown {name!r}; choose from {', '.join(SCHEDULES)} or thundersync:<release>")
        if not {split_schedule(n)[1] for n in args.schedules} <= set(RELEASE_MODES):
            p.error(f"--schedules: release points are {', '.join(RELEASE_MODES)}")
    if args.release:
        args.release = tuple(r.strip() for r in args.release.split(","))
        unknown = [r for r in args.release if r not in RELEASE_MODES]
        if unknown:
            p.error(f"--release: unknown {unknown}; choose from {', '.join(RELEASE_MODES)}")
    if args.grading_latency is not None and args.grading_latency < 0:
        p.error(f"--grading-latency={args.grading_latency}: use ≥ 0")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats={args.repeats}: use ≥ 1")
    if args.steps is not None and args.steps < 2:
        p.error(f"--steps={args.steps}: use ≥ 2 (the first step of every run is warm-up)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.preset in REALGEN_PRESETS:
        from .realgen import main as realgen_main

        return realgen_main(realgen_argv(args.preset, args))
    preset = args.preset or "quick"
    points, repeats, schedules = presets()[preset]
    overrides = {k: getattr(args, k) for k in _KNOBS if getattr(args, k) is not None}
    if "latency_mean" in overrides and "balance" not in overrides:
        overrides["balance"] = None  # an explicit latency replaces calibration
    if "balance" in overrides and "latency_mean" not in overrides:
        overrides["latency_mean"] = None
    points = [w.with_(**overrides) for w in points]
    repeats = args.repeats or repeats
    schedules = with_releases(args.schedules or schedules, args.release)
    name = args.name or (preset + ("-pinned" if args.pin else "") + ("-custom" if overrides else ""))
    out = Path(args.out or f"outputs/bench/{name}.json")
    work = Path(args.work_dir or out.with_name(f"{out.stem}-runs"))
    work.mkdir(parents=True, exist_ok=True)
    cache_path = work / "calibration.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    command = "python -m benchmarks " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                          else sys.argv[1:]))
    started = time.perf_counter()
    print(f"{command}\n{len(points)} point(s) × {repeats} repeat(s) × {', '.join(schedules)}; work dir {work}",
          flush=True)

    resolved = []
    for w in points:
        resolved.append(resolve(w, work, cache, args.pin))
        cache_path.write_text(json.dumps(cache, indent=1))
    total = len(resolved) * repeats * len(schedules)
    results = []
    for k, (w, cal) in enumerate(resolved):
        runs = run_point(w, schedules, repeats, work, args.pin, (k * repeats * len(schedules), total), started)
        loaded = {s: [load_run(r) for r in runs[s]] for s in schedules}
        stats = {s: summarize(loaded[s], args.peak_flops) for s in schedules}
        cmp = compare(stats, {s: [t for r in loaded[s] for t in r.traces] for s in schedules})
        results.append({"name": w.name, "workload": w.to_dict(), "calibration": None if cal is None else cal.to_dict(),
                        "schedules": {s: v.to_dict() for s, v in stats.items()}, "compare": cmp.to_dict(),
                        "runs": runs})
        print_point(w.name, describe(w, cal is not None, args.pin), stats, cmp)
        print_overlap(stats, cmp)

    files = write_plots(results, out, name, preset)
    files["json"] = str(out)
    return write_report(out, command, started, files, preset=preset, pin=args.pin, repeats=repeats,
                        schedules=list(schedules), points=results)


if __name__ == "__main__":
    main()
