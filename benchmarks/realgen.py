"""Benchmark with real generation: a warm-started tiny agent on real sandboxed tasks (issues 10 and 25).

    python -m benchmarks.realgen          # SWE, ~8 min on 2 CPU cores (+ ~2-5 min once for the tiny agents)
    python -m benchmarks.realgen --schedules sync,thundersync:content --steps 3 --repeats 1
    python -m benchmarks.realgen --workload thermostat --steps 5   # the main job: trl, sync/thundersync on the
                                                                   # embedded server and on managed vLLM
    python -m benchmarks.realgen --reuse  # only redo the analysis of the runs already in the work dir

Workloads (`--workload`, `benchmarks/realgen_workloads.py`): `swe` (default) is `examples/swe_grpo.py`'s — the
tool-calling tiny agent, the bundled SWE-style repair tasks with bubblewrap-sandboxed shell tools, the environment's
pass/fail reward (it runs the task's tests: real grading after the last turn) plus the example's small length
penalty, TRL's tool loop (≤ 5 tool rounds, 256 tokens), 16 trajectories per step in groups of 8, one torch thread per
side; `thermostat` is the main job's, `examples/thermostat_grpo.py` (its suite, model and config values, read from
the file). Generation is real: `--rollout-engine` (default `auto`: managed vLLM where a vLLM installation can serve
the model, else one embedded server process), or per schedule with `@engine`. Nothing is scripted: R, L and ρ are
what the model and the tasks make of them.

Schedules (`--schedules`, comma-separated; one process per run, interleaved, first step of each run dropped):
- `sync`, `thundersync:<release>` for release ∈ reward, content, turn (plain `thundersync`: content, the config's
  default): `ThunderSyncGRPOTrainer`; `@vllm`, `@embedded` or `@<rollout_engine>` picks the run's engine
  (`sync@vllm,thundersync@vllm,sync@embedded,...` compares engines in one run);
- `trl`: stock `trl.GRPOTrainer` with the same `environment_factory`, reward functions and config (its own tool loop
  and generation: `transformers` `generate` in the trainer process, no server), traced as one rollout item and one
  learner item per step like `benchmarks/run_one.py` does;
- `gkd` (swe only): `ThunderSyncGKDTrainer` (schedule thundersync, objective "opd", lmbda 1, the same TRL tool loop
  and token budget, a second tiny agent warm-started with another seed as teacher, as `examples/swe_opd.py`) on the
  same tasks: only for the learner-tail comparison (its step does different work, so it gets no speedup).

Reported per schedule (statistics from `benchmarks/stats.py`, tables from `benchmarks/report.py`, per engine, then one
realgen table): step wall, speedup vs the sync runs of the same engine, stock TRL's step wall over it, R, L, ρ = L/R,
the bound (1 + ρ)/max(1, ρ) with ρ from that engine's sync runs and the measurement as a fraction of it, learner tail (s
and % of the step), the generation slowdown during overlap (each turn that ran with the learner busy against the same
(step, trajectory, turn) of the sync runs: median relative and absolute), and the trace-replay prediction of the
schedule's release point (`trace.model.predict_release` on that engine's sync traces) with measured/predicted; then per
GRPO schedule the episodes as both trainers log them (`completions/mean_length`: model tokens per trajectory, tool
results excluded, TRL's definition; `tools/call_frequency`) at step 1, where every schedule samples from the same
initial weights, and over all steps. Writes `<out>.json` and a side-by-side timeline of one step per schedule."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .realgen_summaries import episode_log, episode_rows, format_episode_rows, summarize_distill
from .realgen_workloads import (
    ENGINE_ALIASES,
    ENGINES,
    WORKLOADS,
    RealgenWorkload,
    RunSchedule,
    build_gkd,
    build_grpo,
    build_trl_trainer,
    parse_schedule,
    prepare_models,
    thermostat_workload,
)

GRPO_SCHEDULES = ("sync", "thundersync:reward", "thundersync:content", "thundersync:turn", "trl")
DEFAULT_SCHEDULES = GRPO_SCHEDULES + ("gkd",)
# the thermostat default: the main job's engines side by side with stock TRL (issue 25)
THERMOSTAT_SCHEDULES = ("trl", "sync@embedded", "thundersync@embedded", "sync@vllm", "thundersync@vllm")


def bound(rho: float) -> float:
    """The overlap bound on the speedup over sync at balance ρ = L/R, ignoring the serial suffix P:
    (R + L) / max(R, L) = (1 + ρ) / max(1, ρ)."""
    if rho < 0:
        raise ValueError(f"balance ratio {rho} < 0")
    return (1.0 + rho) / max(1.0, rho)


# --- one run (child process) ----------------------------------------------------------------------------------------


def build_trl(w: RealgenWorkload, model: str, out_dir: Path, timer):
    """Stock `trl.GRPOTrainer` on the same environment, rewards and config; a step trace written per step (one
    rollout item = TRL's generation call incl. its tool loop, one learner item = scoring + loss + backward)."""
    from trl import GRPOTrainer

    from trl_thundersync.streaming.flops import ModelShape, learner_flops
    from trl_thundersync.trace.recorder import TraceWriter
    from trl_thundersync.trace.records import StepTrace, TraceEvent

    from .run_one import TRACE_FILE

    class TimedGRPOTrainer(GRPOTrainer):
        marks: dict = {}

        def _generate(self, prompts):
            start = time.perf_counter()
            try:
                out = super()._generate(prompts)
            finally:
                self.marks.update(rollout=(start, time.perf_counter()))
            self.marks["tokens"] = out
            return out

        def _calculate_rewards(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return super()._calculate_rewards(*args, **kwargs)
            finally:
                self.marks.update(rewards=(start, time.perf_counter()))

        def training_step(self, *args, **kwargs):
            start = time.perf_counter()
            loss = super().training_step(*args, **kwargs)
            self.marks.update(step=(start, time.perf_counter()))
            return loss

    trainer = build_trl_trainer(w, TimedGRPOTrainer, model, out_dir)
    shape = ModelShape.from_config(trainer.model.config)
    writer = TraceWriter(out_dir / TRACE_FILE)

    def on_end(begin: float, end: float) -> None:
        # R = generation (TRL's tool loop included) and reward computation (the environment runs the tests): the
        # rollout side of a sync step; the learner item is everything after it in training_step (scoring forward,
        # loss, backward).
        r0, r1 = trainer.marks["rollout"]
        g0, g1 = trainer.marks.get("rewards", (r1, r1))
        s0, s1 = trainer.marks["step"]
        tokens = _trl_tokens(trainer.marks.get("tokens"))
        rollout_end = max(r1, g1)
        events = [TraceEvent("rollout", "generate_batch", r0, r1, tokens=sum(tokens)),
                  TraceEvent("rollout", "grading", g0, g1),
                  TraceEvent("learner", "score_loss_backward", rollout_end, s1, ready=rollout_end,
                             tokens=sum(tokens), flops=sum(learner_flops(shape, n) for n in tokens)),
                  TraceEvent("barrier", "optimizer", s1, end)]
        writer.append(StepTrace(step=len(timer.intervals) - 1, schedule="trl", start=r0, rollout_end=rollout_end,
                                learner_end=s1, barrier_end=end, publish_end=end, events=tuple(events)))

    timer.on_end = on_end
    return trainer


def _trl_tokens(out) -> list[int]:
    """Prompt + completion tokens per sample from `GRPOTrainer._generate`'s return (a tuple whose first two items
    are the prompt and completion id lists); [] if its shape is not that."""
    try:
        prompt_ids, completion_ids = out[0], out[1]
        return [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
    except (TypeError, IndexError, KeyError):
        return []


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    from .run_one import TRACE_FILE, RunMeter, StepTimer

    w = RealgenWorkload(**spec["workload"])
    schedule = parse_schedule(spec["schedule"], w.rollout_engine)
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TRACE_FILE).unlink(missing_ok=True)
    hf_logging.set_verbosity_error()
    if w.workload == "swe":  # issue 10's one torch thread per side; thermostat keeps the example's defaults
        torch.set_num_threads(1)
    timer = StepTimer()
    meter = RunMeter()
    if schedule.base == "gkd":
        trainer = build_gkd(w, spec["model_dir"], spec["teacher_dir"], out_dir)
    elif schedule.base == "trl":
        trainer = build_trl(w, spec["model_dir"], out_dir, timer)
    else:
        trainer = build_grpo(w, schedule, spec["model_dir"], out_dir)
    measured = meter.train(trainer, timer)
    resolved = getattr(trainer.args, "resolved_rollout_engine", None)
    return {"schedule": schedule.name, "release": schedule.base.partition(":")[2] or None, "workload": w.to_dict(),
            "rollout_engine": resolved() if resolved is not None else "trl", "torch_threads": torch.get_num_threads(),
            "trace": str(out_dir / TRACE_FILE), **measured, "episodes": episode_log(trainer.state.log_history)}


# --- the benchmark (parent) -----------------------------------------------------------------------------------------


def run_child(schedule: str, w: RealgenWorkload, run_dir: Path, models: tuple[str, str | None]) -> dict[str, Any]:
    from .child import spawn_run

    spec = {"schedule": schedule, "workload": w.to_dict(), "out_dir": str(run_dir), "model_dir": models[0],
            "teacher_dir": models[1], "result": str(run_dir / "result.json")}
    return spawn_run("benchmarks.realgen", "--child", spec, run_dir, "log.txt", f"realgen run {schedule}")


def engine_groups(schedules: list[RunSchedule]) -> dict[str, dict[str, str]]:
    """Engine label → {base name: schedule name}: each engine's sync and ThunderSync runs are compared among
    themselves (speedup and replay prediction from that engine's sync runs). `trl` and `gkd` join the only group
    when there is one (the single-engine report as before), else form the group "" of their own."""
    groups: dict[str, dict[str, str]] = {}
    for s in schedules:
        if s.base not in ("trl", "gkd"):
            groups.setdefault(s.label or "", {})[s.base] = s.name
    others = {s.base: s.name for s in schedules if s.base in ("trl", "gkd")}
    if len(groups) == 1:
        next(iter(groups.values())).update(others)
    elif others:
        groups.setdefault("", {}).update(others)
    return groups


def grouped_rows(stats: dict[str, Any], cmps: dict[str, Any], groups: dict[str, dict[str, str]]) -> list[dict]:
    """`realgen_rows` of every engine group (`cmps`: label → its Comparison over base names), named back by schedule
    name, each with its engine label and `vs_trl` = stock TRL's step wall ÷ its step wall (> 1: faster than TRL)."""
    trl = stats.get("trl")
    rows = []
    for label, names in groups.items():
        for row in realgen_rows({base: stats[name] for base, name in names.items()}, cmps.get(label)):
            row["schedule"], row["engine"] = names[row["schedule"]], label or None
            row["vs_trl"] = trl.step_wall_s / row["step_wall_s"] if trl is not None and row["step_wall_s"] else None
            rows.append(row)
    return rows


def realgen_rows(stats: dict[str, Any], cmp: Any) -> list[dict[str, Any]]:
    """Per schedule: the realgen table's values (pure: `stats` name → ScheduleSummary, `cmp` a Comparison over the
    GRPO schedules; a schedule not in `cmp.speedup` — the distillation run — gets no speedup, bound or slowdown)."""
    sync = stats.get("sync")
    rho = sync.balance_ratio if sync is not None else None
    b = bound(rho) if rho is not None else None
    rows = []
    for name, s in stats.items():
        speedup = cmp.speedup.get(name) if cmp is not None else None
        turn = ((cmp.overlap_vs_sync or {}).get(name, {}).get("turn_busy_vs_sync", {}) if cmp is not None else {})
        predicted = (cmp.predicted_from_sync or {}).get(name) if cmp is not None else None
        if predicted is None and name == "sync" and sync is not None:
            predicted = 1.0
        rows.append({
            "schedule": name, "step_wall_s": s.step_wall_s, "speedup": speedup, "rollout_s": s.rollout_s,
            "learner_s": s.learner_busy_s, "rho": s.balance_ratio,
            "bound": b if speedup is not None else None,
            "of_bound": speedup / b if speedup is not None and b else None,
            "tail_s": s.learner_tail_s, "tail_frac": s.learner_tail_s / s.step_wall_s if s.step_wall_s else None,
            "turn_busy_vs_sync": turn.get("relative"), "turn_busy_vs_sync_s": turn.get("seconds"),
            "turn_pairs": turn.get("pairs", 0), "turn_busy_s": s.turn_busy_s, "turn_idle_s": s.turn_idle_s,
            "predicted_speedup": predicted,
            "prediction_gap": speedup / predicted - 1.0 if speedup is not None and predicted else None,
            "measured_over_predicted": speedup / predicted if speedup is not None and predicted else None,
        })
    return rows


def _f(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else format(x, spec) + suffix


def format_rows(rows: list[dict[str, Any]], rho_sync: dict[str, float] | float | None) -> list[str]:
    """A markdown table of `realgen_rows` / `grouped_rows` (printed and pasted into BENCHMARKS.md); `rho_sync`: the
    sync runs' ρ per engine label (or one value), stated under the table."""
    head = ("| schedule | step s | speedup vs sync | stock TRL step ÷ this | R s | L s | ρ | bound (1+ρ)/max(1,ρ) | "
            "of bound | tail s | tail % | turn with learner busy vs sync | replay prediction | measured/predicted |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        turn = (f"{r['turn_busy_vs_sync']:+.1%} ({r['turn_busy_vs_sync_s'] * 1e3:+.1f} ms, n={r['turn_pairs']})"
                if r["turn_busy_vs_sync"] is not None else "-")
        lines.append(
            f"| {r['schedule']} | {r['step_wall_s']:.2f} | {_f(r['speedup'], '.2f', '×')} | "
            f"{_f(r.get('vs_trl'), '.2f', '×')} | {r['rollout_s']:.2f} | "
            f"{r['learner_s']:.2f} | {r['rho']:.2f} | {_f(r['bound'], '.2f', '×')} | {_f(r['of_bound'], '.0%')} | "
            f"{r['tail_s']:.2f} | {_f(r['tail_frac'], '.1%')} | {turn} | {_f(r['predicted_speedup'], '.2f', '×')} | "
            f"{_f(r.get('measured_over_predicted'), '.3f')} |")
    rhos = rho_sync if isinstance(rho_sync, dict) else ({} if rho_sync is None else {"": rho_sync})
    for label, rho in rhos.items():
        lines.append(f"\nρ of the bound{f' ({label})' if label else ''}: the sync runs' L/R = {rho:.2f}, bound "
                     f"{bound(rho):.2f}×.")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.realgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--workload", choices=WORKLOADS, default="swe",
                   help="swe: examples/swe_grpo.py's (issue 10); thermostat: examples/thermostat_grpo.py's (the main "
                        "job: its suite, model and config values)")
    p.add_argument("--rollout-engine", default="auto", choices=[*ENGINE_ALIASES, *ENGINES],
                   help="rollout_engine of the schedules that do not name one with @ (vllm = managed_vllm, embedded = "
                        "embedded_server); default auto: managed vLLM where it can serve the model, else embedded")
    p.add_argument("--schedules", help=f"comma-separated; swe default {','.join(DEFAULT_SCHEDULES)}, thermostat "
                   f"default {','.join(THERMOSTAT_SCHEDULES)}; sync/thundersync[:<release>] take @<engine>")
    p.add_argument("--repeats", type=int, default=2, help="runs per schedule (interleaved)")
    p.add_argument("--steps", type=int, default=RealgenWorkload.steps, help="optimizer steps per run (first dropped)")
    p.add_argument("--batch", type=int, help="trajectories per step (default: the workload's)")
    p.add_argument("--group", type=int, help="GRPO group size (default: the workload's)")
    p.add_argument("--max-completion-length", type=int, help="token budget per trajectory (default: the workload's)")
    p.add_argument("--num-tasks", type=int, help="first N tasks of the suite (default all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grading-workers", type=int, help="grading_workers of the sync/thundersync runs (default: the "
                   "config's default; 1 grades one environment at a time, as stock TRL does)")
    p.add_argument("--out", help="JSON path (default outputs/bench/realgen.json, realgen-thermostat.json for "
                   "thermostat); timeline PNG beside it")
    p.add_argument("--work-dir", help="runs, traces, logs and the tiny agents (default <out stem>-runs)")
    p.add_argument("--reuse", action="store_true",
                   help="keep the runs whose result.json is already in the work dir (same knobs!) and only redo "
                        "the analysis and the missing runs")
    args = p.parse_args(argv)
    if args.child is None:
        args.rollout_engine = ENGINE_ALIASES.get(args.rollout_engine, args.rollout_engine)
        default = THERMOSTAT_SCHEDULES if args.workload == "thermostat" else DEFAULT_SCHEDULES
        names = [n.strip() for n in (args.schedules or ",".join(default)).split(",") if n.strip()]
        try:
            args.run_schedules = tuple(parse_schedule(n, args.rollout_engine) for n in names)
        except ValueError as err:
            p.error(f"--schedules: {err}")
        args.schedules = tuple(s.name for s in args.run_schedules)
        runs = [(s.base, s.engine) for s in args.run_schedules]
        if len(set(runs)) < len(runs):
            p.error(f"--schedules: {names} names the same run twice")
        if args.workload == "thermostat" and "gkd" in args.schedules:
            p.error("--schedules: gkd is the SWE distillation comparison (workload swe)")
        if args.steps < 2:
            p.error("--steps: use ≥ 2 (the first step of every run is warm-up)")
        if args.repeats < 1:
            p.error("--repeats: use ≥ 1")
        args.out = args.out or ("outputs/bench/realgen.json" if args.workload == "swe"
                                else f"outputs/bench/realgen-{args.workload}.json")
    return args


def workload_of(args: argparse.Namespace) -> RealgenWorkload:
    """The `RealgenWorkload` of parsed arguments: the workload's own defaults where a knob is not given."""
    knobs = dict(steps=args.steps, batch=args.batch, group=args.group,
                 max_completion_length=args.max_completion_length, seed=args.seed, num_tasks=args.num_tasks,
                 grading_workers=args.grading_workers, rollout_engine=args.rollout_engine)
    if args.workload == "thermostat":
        return thermostat_workload(**knobs)
    return RealgenWorkload(**{k: v for k, v in knobs.items() if v is not None or k in ("num_tasks",
                                                                                    "grading_workers")})


def analyze(loaded: dict[str, list[Any]], schedules: tuple[RunSchedule, ...], description: str):
    """Per engine group: summaries, the comparison (speedups and replay predictions from that engine's sync runs),
    the printed tables; returns (stats by schedule name, comparisons by engine label, groups, realgen rows)."""
    from .report import print_overlap, print_point
    from .stats import compare, summarize

    stats: dict[str, Any] = {s.name: summarize(loaded[s.name]) for s in schedules if s.base != "gkd"}
    if "gkd" in loaded:
        stats["gkd"] = summarize_distill(loaded["gkd"])
    groups = engine_groups(list(schedules))
    cmps = {}
    for label, names in groups.items():
        grpo = {base: stats[name] for base, name in names.items() if base != "gkd"}
        cmps[label] = compare(grpo, {base: [t for r in loaded[names[base]] for t in r.traces] for base in grpo})
        title = f"realgen@{label}" if label else "realgen (own generation)"
        print_point(title, description, grpo, cmps[label])
        print_overlap(grpo, cmps[label])
    return stats, cmps, groups, grouped_rows(stats, cmps, groups)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.child is not None:
        spec = json.loads(args.child)
        Path(spec["result"]).write_text(json.dumps(run(spec), indent=1))
        return None

    from trl_thundersync.trace.export import plot_timeline, read_jsonl

    from .report import write_report
    from .stats import measured_run, side_by_side

    w = workload_of(args)
    out = Path(args.out)
    work = Path(args.work_dir or out.with_name(f"{out.stem}-runs"))
    work.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.realgen " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    started = time.perf_counter()
    print(f"{command}\n{args.repeats} repeat(s) × {', '.join(args.schedules)}; work dir {work}", flush=True)
    models = prepare_models(work, w, teacher="gkd" in args.schedules)
    print(f"tiny agents ready ({time.perf_counter() - started:.0f} s)", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.schedules}
    total, done = args.repeats * len(args.schedules), 0
    for r in range(args.repeats):
        for schedule in args.schedules:
            done += 1
            run_dir = work / f"{schedule.replace(':', '-').replace('@', '-')}-{r}"
            if args.reuse and (run_dir / "result.json").exists():  # a finished run of an earlier invocation
                result = json.loads((run_dir / "result.json").read_text())
                result["log"] = str(run_dir / "log.txt")
            else:
                result = run_child(schedule, w, run_dir, models)
            runs[schedule].append(result)
            walls = [b - a for a, b in result["step_intervals"][1:]]
            print(f"[{done}/{total}] {schedule:<26} repeat {r + 1}: mean step {statistics.fmean(walls):.2f} s, run "
                  f"{result['run_seconds']:.0f} s ({result.get('rollout_engine', '?')}), other processes "
                  f"{result['foreign_cpu_cores']:.2f} cores (elapsed {time.perf_counter() - started:.0f} s)",
                  flush=True)

    def load(result):
        walls = [b - a for a, b in result["step_intervals"]]
        return measured_run(walls, read_jsonl(result["trace"]), result)

    loaded = {s: [load(r) for r in runs[s]] for s in args.schedules}
    suite = "bundled SWE tasks, real grading (tests)" if w.workload == "swe" else "thermostat train tasks"
    description = (f"B={w.batch} G={w.group} steps={w.steps}, tiny agent, {suite}, TRL tool loop "
                   f"(≤ {w.max_tool_calling_iterations} tool rounds, {w.max_completion_length} tokens), real "
                   f"generation (engine per schedule; stock TRL: generate in-process)")
    stats, cmps, groups, rows = analyze(loaded, args.run_schedules, description)
    rho_sync = {label: stats[names["sync"]].balance_ratio for label, names in groups.items() if "sync" in names}
    print("\n" + "\n".join(format_rows(rows, rho_sync)))
    episodes = episode_rows(runs)
    if episodes:  # completions/mean_length and tools/call_frequency as both trainers log them (TRL's definitions)
        print("\nEpisodes (logged per step; lengths in model tokens, tool results excluded, as TRL counts them):\n"
              + "\n".join(format_episode_rows(episodes)))
    tails = {r["schedule"]: r["tail_s"] for r in rows}
    if "gkd" in tails:
        for name in (n for n in tails if n.startswith("thundersync")):
            verdict = "≤" if tails[name] <= tails["gkd"] else ">"
            print(f"learner tail {name} {tails[name]:.2f} s {verdict} gkd (thundersync) {tails['gkd']:.2f} s")

    steps = []
    for schedule, rs in runs.items():
        traces = read_jsonl(rs[-1]["trace"])
        steps.append(dataclasses.replace(traces[1] if len(traces) > 1 else traces[0], schedule=schedule))
    files = {"json": str(out)}
    try:
        files["timeline_png"] = str(plot_timeline(side_by_side(steps), out.with_name(f"{out.stem}-timeline.png"),
                                                  title="realgen: one step of each schedule"))
    except Exception as exc:  # a plot must not lose the measurements
        print(f"timeline not written: {exc}")
    single = cmps[next(iter(cmps))].to_dict() if len(cmps) == 1 else None
    return write_report(out, command, started, files, workload=w.to_dict(), repeats=args.repeats,
                        schedules=list(args.schedules), summaries={s: v.to_dict() for s, v in stats.items()},
                        compare=single, compare_by_engine={k: c.to_dict() for k, c in cmps.items()},
                        engine_groups=groups, rows=rows, episodes=episodes, runs=runs)


if __name__ == "__main__":
    main()
