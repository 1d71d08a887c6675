"""Benchmark with real generation: the warm-started tiny agent on the bundled SWE repair tasks (issue 10).

    python -m benchmarks.realgen          # ~8 min on 2 CPU cores (+ ~2-5 min once for the tiny agents)
    python -m benchmarks.realgen --schedules sync,thundersync:content --steps 3 --repeats 1
    python -m benchmarks.realgen --reuse  # only redo the analysis of the runs already in the work dir

The workload of `examples/swe_grpo.py`: the tool-calling tiny agent (`tiny/agent.py`, built once in the work
dir), the bundled SWE-style repair tasks with bubblewrap-sandboxed shell tools, the environment's pass/fail reward
(it runs the task's tests: real grading after the last turn) plus the example's small length penalty, TRL 1.16's tool
loop (`agent_protocol="trl"`, `max_tool_calling_iterations=5`), 16 trajectories per step in groups of 8, and real
generation through the default engine (`rollout_engine="auto"` → one embedded vLLM-API server process, one torch
thread; the learner gets the other). Nothing is scripted: R, L and ρ are what the model and the tasks make of them.

Schedules (`--schedules`, comma-separated; one process per run, interleaved, first step of each run dropped):
- `sync`, `thundersync:<release>` for release ∈ reward, content, turn: `ThunderSyncGRPOTrainer`;
- `trl`: stock `trl.GRPOTrainer` with the same `environment_factory`, reward functions and config (its own tool loop
  and generation: `transformers` `generate` in the trainer process, no server), traced as one rollout item and one
  learner item per step like `bench/run_one.py` does;
- `gkd`: `ThunderSyncGKDTrainer` (schedule thundersync, objective "opd", lmbda 1, the same TRL tool loop and token
  budget, a second tiny agent warm-started with another seed as teacher, as `examples/swe_opd.py`) on the same tasks:
  only for the learner-tail comparison (its step does different work, so it gets no speedup vs the GRPO sync run).

Reported per schedule (statistics from `bench/stats.py`, tables from `bench/report.py`, then one realgen table):
step wall, speedup vs sync, R, L, ρ = L/R, the bound (1 + ρ)/max(1, ρ) with ρ from the sync runs and the
measurement as a fraction of it, learner tail (s and % of the step), the generation slowdown during overlap (each
turn that ran with the learner busy against the same (step, trajectory, turn) of the sync runs: median relative
and absolute), and the trace-replay prediction of the schedule's release point (`trace.model.predict_release` on
the sync traces); then per GRPO schedule the episodes as both trainers log them (`completions/mean_length`: model
tokens per trajectory, tool results excluded, TRL's definition; `tools/call_frequency`) at step 1, where every
schedule samples from the same initial weights, and over all steps. Writes `<out>.json` and a side-by-side timeline
of one step per schedule.
"""

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

GRPO_SCHEDULES = ("sync", "thundersync:reward", "thundersync:content", "thundersync:turn", "trl")
DEFAULT_SCHEDULES = GRPO_SCHEDULES + ("gkd",)


@dataclasses.dataclass(frozen=True)
class RealgenWorkload:
    """Knobs of the real-generation workload (defaults: the issue-10 user workload)."""

    steps: int = 4  # optimizer steps per run; the first is warm-up
    batch: int = 16
    group: int = 8
    max_completion_length: int = 256  # tokens per trajectory (TRL's budget: all turns and tool results)
    max_tool_calling_iterations: int = 5
    seed: int = 0
    num_tasks: int | None = None  # first N bundled tasks (None: all)
    grading_workers: int | None = None  # ThunderSyncGRPOConfig.grading_workers of the ThunderSync schedules

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def bound(rho: float) -> float:
    """The overlap bound on the speedup over sync at balance ρ = L/R, ignoring the serial suffix P:
    (R + L) / max(R, L) = (1 + ρ) / max(1, ρ)."""
    if rho < 0:
        raise ValueError(f"balance ratio {rho} < 0")
    return (1.0 + rho) / max(1.0, rho)


# --- one run (child process) ----------------------------------------------------------------------------------------


def _tasks(w: RealgenWorkload):
    from trl_thundersync.envs.tasks import load_swe_suite

    tasks = load_swe_suite()
    if w.num_tasks:
        tasks = dict(list(tasks.items())[: w.num_tasks])
    return tasks


def _grpo_common(w: RealgenWorkload) -> dict[str, Any]:
    from trl_thundersync.agentic import LENGTH_PENALTY  # the examples' weight of `shorter_is_better`

    return dict(per_device_train_batch_size=w.batch, num_generations=w.group, max_steps=w.steps,
                max_completion_length=w.max_completion_length,
                max_tool_calling_iterations=w.max_tool_calling_iterations, learning_rate=1e-5, seed=w.seed,
                logging_steps=1, disable_tqdm=True, reward_weights=[LENGTH_PENALTY])


def build_grpo(w: RealgenWorkload, schedule: str, release: str, model: str, out_dir: Path):
    from tests.fixtures.parity import cpu_config, load_model
    from trl_thundersync.agentic import shorter_is_better
    from trl_thundersync.envs.environments.swe import SWERepairEnv
    from trl_thundersync.envs.tasks import swe_dataset
    from trl_thundersync.trainers.grpo_config import ThunderSyncGRPOConfig
    from trl_thundersync.trainers.grpo_trainer import ThunderSyncGRPOTrainer

    tasks = _tasks(w)
    args = cpu_config(ThunderSyncGRPOConfig, out_dir, **_grpo_common(w), schedule=schedule, release=release,
                      learner_num_threads=1, rollout_num_threads=1, grading_workers=w.grading_workers)
    return ThunderSyncGRPOTrainer(model=load_model(model), reward_funcs=[shorter_is_better], args=args,
                                  train_dataset=swe_dataset(tasks), environment_factory=lambda: SWERepairEnv(tasks))


def build_gkd(w: RealgenWorkload, model: str, teacher: str, out_dir: Path):
    from tests.fixtures.parity import load_model
    from trl_thundersync.envs.environments.swe import SWERepairEnv
    from trl_thundersync.envs.tasks import swe_dataset
    from trl_thundersync.trainers.gkd_config import ThunderSyncGKDConfig
    from trl_thundersync.trainers.gkd_trainer import ThunderSyncGKDTrainer

    tasks = _tasks(w)
    # cpu_config's base has GRPO-only fields (num_generations, max_completion_length): the same CPU settings here
    args = ThunderSyncGKDConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        gradient_checkpointing=False, per_device_train_batch_size=w.batch, max_steps=w.steps, learning_rate=1e-5,
        seed=w.seed, logging_steps=1, disable_tqdm=True, lmbda=1.0, objective="opd", schedule="thundersync",
        agent_protocol="trl", max_new_tokens=w.max_completion_length,
        max_tool_calling_iterations=w.max_tool_calling_iterations, learner_num_threads=1, rollout_num_threads=1)
    return ThunderSyncGKDTrainer(model=load_model(model), teacher_model=load_model(teacher), args=args,
                                 train_dataset=swe_dataset(tasks), environment_factory=lambda: SWERepairEnv(tasks))


def build_trl(w: RealgenWorkload, model: str, out_dir: Path, timer):
    """Stock `trl.GRPOTrainer` on the same environment, rewards and config; a step trace written per step (one
    rollout item = TRL's generation call incl. its tool loop, one learner item = scoring + loss + backward)."""
    from trl import GRPOConfig, GRPOTrainer

    from tests.fixtures.parity import cpu_config, load_model
    from trl_thundersync.agentic import shorter_is_better
    from trl_thundersync.envs.environments.swe import SWERepairEnv
    from trl_thundersync.envs.tasks import swe_dataset
    from trl_thundersync.trace.flops import ModelShape, learner_flops
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

    tasks = _tasks(w)
    args = cpu_config(GRPOConfig, out_dir, **_grpo_common(w))
    trainer = TimedGRPOTrainer(model=load_model(model), reward_funcs=[shorter_is_better], args=args,
                               train_dataset=swe_dataset(tasks), environment_factory=lambda: SWERepairEnv(tasks))
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
    from .workload import split_schedule

    w = RealgenWorkload(**spec["workload"])
    schedule = spec["schedule"]
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TRACE_FILE).unlink(missing_ok=True)
    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    timer = StepTimer()
    meter = RunMeter()
    release = None
    if schedule == "gkd":
        trainer = build_gkd(w, spec["model_dir"], spec["teacher_dir"], out_dir)
    elif schedule == "trl":
        trainer = build_trl(w, spec["model_dir"], out_dir, timer)
    else:
        trainer_schedule, release = split_schedule(schedule)
        trainer = build_grpo(w, trainer_schedule, release, spec["model_dir"], out_dir)
    measured = meter.train(trainer, timer)
    return {"schedule": schedule, "release": release, "workload": w.to_dict(), "trace": str(out_dir / TRACE_FILE),
            **measured, "episodes": episode_log(trainer.state.log_history)}


# the episode figures both GRPO trainers log per step, with TRL's definitions (lengths: model tokens, tool mask 1)
EPISODE_KEYS = ("completions/mean_length", "completions/max_length", "completions/clipped_ratio",
                "tools/call_frequency")


def episode_log(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per logged training step, the `EPISODE_KEYS` values (steps without completion metrics are skipped)."""
    return [{k: float(h[k]) for k in EPISODE_KEYS if k in h} for h in log_history if "completions/mean_length" in h]


def episode_rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per GRPO schedule, from its runs' `episodes`: model tokens per trajectory at step 1 (the initial weights, the
    same for every schedule: episodes must agree there) and over all steps (mean and range of the step means), tool
    calls per trajectory. Runs without `episodes` (reports older than this field) are skipped."""
    rows = []
    for name, results in runs.items():
        steps = [r["episodes"] for r in results if r.get("episodes") and name != "gkd"]
        if not steps:
            continue
        first = [s[0]["completions/mean_length"] for s in steps]
        every = [e["completions/mean_length"] for s in steps for e in s]
        calls = [e["tools/call_frequency"] for s in steps for e in s if "tools/call_frequency" in e]
        rows.append({"schedule": name, "runs": len(steps), "step1_model_tokens": statistics.fmean(first),
                     "model_tokens": statistics.fmean(every), "model_tokens_min": min(every),
                     "model_tokens_max": max(every), "tool_calls": statistics.fmean(calls) if calls else None})
    return rows


def format_episode_rows(rows: list[dict[str, Any]]) -> list[str]:
    head = ("| schedule | runs | model tokens / trajectory, step 1 | all steps: mean (range of step means) | "
            "tool calls / trajectory |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['schedule']} | {r['runs']} | {r['step1_model_tokens']:.1f} | {r['model_tokens']:.1f} "
                     f"({r['model_tokens_min']:.1f}–{r['model_tokens_max']:.1f}) | {_f(r['tool_calls'], '.2f')} |")
    return lines


# --- the benchmark (parent) -----------------------------------------------------------------------------------------


def prepare_models(work: Path) -> tuple[Path, Path]:
    """The tiny agent student (seed 0) and teacher (seed 1), built once in `work` (about a minute each)."""
    from trl_thundersync.tiny.agent import save_tiny_agent_model

    return save_tiny_agent_model(work / "tiny-agent"), save_tiny_agent_model(work / "tiny-agent-teacher", seed=1)


def run_child(schedule: str, w: RealgenWorkload, run_dir: Path, models: tuple[Path, Path]) -> dict[str, Any]:
    from .child import spawn_run

    spec = {"schedule": schedule, "workload": w.to_dict(), "out_dir": str(run_dir), "model_dir": str(models[0]),
            "teacher_dir": str(models[1]), "result": str(run_dir / "result.json")}
    return spawn_run("benchmarks.realgen", "--child", spec, run_dir, "log.txt", f"realgen run {schedule}")


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
        })
    return rows


@dataclasses.dataclass(frozen=True)
class DistillSummary:
    """The distillation run's figures realgen reports (its traces have no rewards, so `stats.summarize`, which
    replays every GRPO release point, does not apply): means over the measured steps, s."""

    steps: int
    step_wall_s: float
    rollout_s: float  # R: batch admitted → last trajectory scored by the teacher
    learner_busy_s: float  # L
    balance_ratio: float  # L/R
    learner_tail_s: float  # [c_n − R]⁺
    turn_busy_s: float | None  # median rollout turn with the learner busy (`stats.overlap_split`)
    turn_idle_s: float | None
    replay_thundersync_s: float  # Eq. 14 replay of its own steps (`stats.predict_thundersync`)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize_distill(runs: list[Any]) -> DistillSummary:
    """`DistillSummary` of `stats.RunSteps` (warm-up dropped) from the distillation trainer."""
    from .stats import overlap_split, predict_thundersync

    walls = [w for r in runs for w in r.walls]
    traces = [t for r in runs for t in r.traces]
    if not traces:
        raise ValueError("summarize_distill needs at least one measured step")
    reps = [predict_thundersync(t) for t in traces]
    busy, idle = overlap_split(traces, "rollout", "turn")
    return DistillSummary(
        steps=len(traces), step_wall_s=statistics.fmean(walls),
        rollout_s=statistics.fmean(r.rollout_end for r in reps),
        learner_busy_s=statistics.fmean(r.learner_service for r in reps),
        balance_ratio=statistics.fmean(r.balance_ratio for r in reps),
        learner_tail_s=statistics.fmean(max(0.0, t.learner_end - t.rollout_end) for t in traces),
        turn_busy_s=statistics.median(busy) if busy else None, turn_idle_s=statistics.median(idle) if idle else None,
        replay_thundersync_s=statistics.fmean(r.thundersync_time for r in reps))


def _f(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else format(x, spec) + suffix


def format_rows(rows: list[dict[str, Any]], rho_sync: float | None) -> list[str]:
    """A markdown table of `realgen_rows` (printed and pasted into BENCHMARKS.md)."""
    head = ("| schedule | step s | speedup | R s | L s | ρ | bound (1+ρ)/max(1,ρ) | of bound | tail s | tail % | "
            "turn with learner busy vs sync | replay prediction | gap |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        turn = (f"{r['turn_busy_vs_sync']:+.1%} ({r['turn_busy_vs_sync_s'] * 1e3:+.1f} ms, n={r['turn_pairs']})"
                if r["turn_busy_vs_sync"] is not None else "-")
        lines.append(
            f"| {r['schedule']} | {r['step_wall_s']:.2f} | {_f(r['speedup'], '.2f', '×')} | {r['rollout_s']:.2f} | "
            f"{r['learner_s']:.2f} | {r['rho']:.2f} | {_f(r['bound'], '.2f', '×')} | {_f(r['of_bound'], '.0%')} | "
            f"{r['tail_s']:.2f} | {_f(r['tail_frac'], '.1%')} | {turn} | {_f(r['predicted_speedup'], '.2f', '×')} | "
            f"{_f(None if r['prediction_gap'] is None else r['prediction_gap'] * 100, '+.1f', '%')} |")
    if rho_sync is not None:
        lines.append(f"\nρ of the bound: the sync runs' L/R = {rho_sync:.2f}, bound {bound(rho_sync):.2f}×.")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.realgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES),
                   help=f"comma-separated subset of {', '.join(DEFAULT_SCHEDULES)}")
    p.add_argument("--repeats", type=int, default=2, help="runs per schedule (interleaved)")
    p.add_argument("--steps", type=int, default=RealgenWorkload.steps, help="optimizer steps per run (first dropped)")
    p.add_argument("--batch", type=int, default=RealgenWorkload.batch)
    p.add_argument("--group", type=int, default=RealgenWorkload.group)
    p.add_argument("--max-completion-length", type=int, default=RealgenWorkload.max_completion_length)
    p.add_argument("--num-tasks", type=int, help="first N bundled SWE tasks (default all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grading-workers", type=int, help="grading_workers of the sync/thundersync runs (default: the "
                   "config's default; 1 grades one environment at a time, as stock TRL does)")
    p.add_argument("--out", default="outputs/bench/realgen.json", help="JSON path; timeline PNG beside it")
    p.add_argument("--work-dir", help="runs, traces, logs and the tiny agents (default <out stem>-runs)")
    p.add_argument("--reuse", action="store_true",
                   help="keep the runs whose result.json is already in the work dir (same knobs!) and only redo "
                        "the analysis and the missing runs")
    args = p.parse_args(argv)
    if args.child is None:
        args.schedules = tuple(s.strip() for s in args.schedules.split(",") if s.strip())
        unknown = [s for s in args.schedules if s not in DEFAULT_SCHEDULES]
        if unknown:
            p.error(f"--schedules: unknown {unknown}; choose from {', '.join(DEFAULT_SCHEDULES)}")
        if args.steps < 2:
            p.error("--steps: use ≥ 2 (the first step of every run is warm-up)")
        if args.repeats < 1:
            p.error("--repeats: use ≥ 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.child is not None:
        spec = json.loads(args.child)
        Path(spec["result"]).write_text(json.dumps(run(spec), indent=1))
        return None

    from trl_thundersync.trace.export import plot_timeline, read_jsonl

    from .report import print_overlap, print_point, write_report
    from .stats import compare, measured_run, side_by_side, summarize

    w = RealgenWorkload(steps=args.steps, batch=args.batch, group=args.group,
                        max_completion_length=args.max_completion_length, seed=args.seed, num_tasks=args.num_tasks,
                        grading_workers=args.grading_workers)
    out = Path(args.out)
    work = Path(args.work_dir or out.with_name(f"{out.stem}-runs"))
    work.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.realgen " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    started = time.perf_counter()
    print(f"{command}\n{args.repeats} repeat(s) × {', '.join(args.schedules)}; work dir {work}", flush=True)
    models = prepare_models(work)
    print(f"tiny agents ready ({time.perf_counter() - started:.0f} s)", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.schedules}
    total, done = args.repeats * len(args.schedules), 0
    for r in range(args.repeats):
        for schedule in args.schedules:
            done += 1
            run_dir = work / f"{schedule.replace(':', '-')}-{r}"
            if args.reuse and (run_dir / "result.json").exists():  # a finished run of an earlier invocation
                result = json.loads((run_dir / "result.json").read_text())
                result["log"] = str(run_dir / "log.txt")
            else:
                result = run_child(schedule, w, run_dir, models)
            runs[schedule].append(result)
            walls = [b - a for a, b in result["step_intervals"][1:]]
            print(f"[{done}/{total}] {schedule:<19} repeat {r + 1}: mean step {statistics.fmean(walls):.2f} s, run "
                  f"{result['run_seconds']:.0f} s, other processes {result['foreign_cpu_cores']:.2f} cores "
                  f"(elapsed {time.perf_counter() - started:.0f} s)", flush=True)

    def load(result):
        walls = [b - a for a, b in result["step_intervals"]]
        return measured_run(walls, read_jsonl(result["trace"]), result)

    loaded = {s: [load(r) for r in runs[s]] for s in args.schedules}
    grpo = {s: summarize(loaded[s]) for s in args.schedules if s != "gkd"}
    cmp = compare(grpo, {s: [t for r in loaded[s] for t in r.traces] for s in grpo})
    stats: dict[str, Any] = dict(grpo)
    if "gkd" in loaded:
        stats["gkd"] = summarize_distill(loaded["gkd"])
    description = (f"B={w.batch} G={w.group} steps={w.steps}, tiny agent, bundled SWE tasks, TRL tool loop "
                   f"(≤ {w.max_tool_calling_iterations} tool rounds, {w.max_completion_length} tokens), real "
                   f"generation (embedded server; stock TRL: generate in-process), real grading (tests)")
    print_point("realgen", description, grpo, cmp)
    print_overlap(grpo, cmp)
    rows = realgen_rows(stats, cmp)
    rho_sync = stats["sync"].balance_ratio if "sync" in stats else None
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
    return write_report(out, command, started, files, workload=w.to_dict(), repeats=args.repeats,
                        schedules=list(args.schedules), summaries={s: v.to_dict() for s, v in stats.items()},
                        compare=cmp.to_dict(), rows=rows, episodes=episodes, runs=runs)


if __name__ == "__main__":
    main()
