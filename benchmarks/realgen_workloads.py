"""The workloads and schedule names of `benchmarks/realgen.py`: what one run trains on, with which engine.

Workloads (`--workload`):
- `swe`: `examples/swe_grpo.py`'s (issue 10): the tool-calling tiny agent, the bundled SWE repair tasks with
  sandboxed tests as grading, the environment's pass/fail reward plus the examples' small length penalty, TRL's tool
  loop (≤ 5 tool rounds, 256 tokens), 16 trajectories per step in groups of 8, one torch thread each side.
- `thermostat`: the main job's, `examples/thermostat_grpo.py`: its suite, its model (`resolve_model`, built once in
  the work dir) and every config value its `run_learning_example(...)` call passes (read from the file, so the
  benchmark follows the example), the environment's reward only, the example's thread defaults. Its learning-rate
  schedule spans the example's `max_steps` and the run stops after `--steps` (`StopAt`), so each measured step
  trains with the example's learning rate.

Schedule names: `sync`, `thundersync:<release>` (plain `thundersync`: the config's default release, `content`, as the
main job runs), `trl` (stock `trl.GRPOTrainer`, its own generation) and `gkd`; a GRPO schedule may name its rollout
engine after `@` — `sync@vllm`, `thundersync@embedded`, `thundersync:reward@managed_vllm` — so engines compare in
one interleaved run (`vllm` = `managed_vllm`, `embedded` = `embedded_server`; without `@`: `--rollout-engine`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path
from typing import Any, get_args

from trl_thundersync.trainers.rollout_config import RolloutEngine

REPO_ROOT = Path(__file__).resolve().parents[1]
THERMOSTAT_EXAMPLE = REPO_ROOT / "examples" / "thermostat_grpo.py"
WORKLOADS = ("swe", "thermostat")
ENGINES: tuple[str, ...] = get_args(RolloutEngine)
ENGINE_ALIASES = {"vllm": "managed_vllm", "embedded": "embedded_server"}
ENGINE_LABELS = {engine: alias for alias, engine in ENGINE_ALIASES.items()}
DEFAULT_RELEASE = "content"  # ThunderSyncGRPOConfig.release's default (a unit test holds them equal)
RELEASES = ("reward", "content", "turn")
# example keywords that are not training settings of a benchmark run (its folders, the model, reporting)
_NOT_CONFIG = ("model_name_or_path", "output_dir", "report_to", "save_strategy", "max_steps")


@dataclasses.dataclass(frozen=True)
class RunSchedule:
    """One benchmark schedule: its canonical name, what the trainer runs, and the engine it samples with."""

    name: str  # canonical: "sync@vllm", "thundersync:content@embedded", "trl", "sync" (engine from --rollout-engine)
    base: str  # the name without the engine: "sync", "thundersync:content", "trl", "gkd"
    engine: str | None  # a `rollout_engine` value; None for `trl` (TRL generates itself)
    tagged: bool  # whether the name carried its engine (`@`)

    @property
    def label(self) -> str | None:
        """The engine as the names spell it (`vllm`, `embedded`, or the config value)."""
        return None if self.engine is None else ENGINE_LABELS.get(self.engine, self.engine)


def parse_schedule(name: str, default_engine: str = "auto") -> RunSchedule:
    """`RunSchedule` of a `--schedules` entry; ValueError for an unknown name, release or engine."""
    base, at, engine = name.strip().partition("@")
    schedule, _, release = base.partition(":")
    if schedule not in ("sync", "thundersync", "trl", "gkd") or (release and schedule != "thundersync"):
        raise ValueError(f"unknown schedule {name!r}: use sync, thundersync[:<release>], trl or gkd, optionally "
                         "@<engine> for sync/thundersync")
    if schedule == "thundersync":
        release = release or DEFAULT_RELEASE
        if release not in RELEASES:
            raise ValueError(f"{name!r}: release {release!r} is not one of {', '.join(RELEASES)}")
        base = f"thundersync:{release}"
    if at and schedule in ("trl", "gkd"):
        raise ValueError(f"{name!r}: only sync/thundersync take @<engine> (trl generates itself; gkd uses "
                         "--rollout-engine)")
    if at:
        engine = ENGINE_ALIASES.get(engine, engine)
        if engine not in ENGINES:
            raise ValueError(f"{name!r}: engine must be one of {', '.join([*ENGINE_ALIASES, *ENGINES])}")
    else:
        engine = default_engine
    if schedule == "trl":
        return RunSchedule(name="trl", base="trl", engine=None, tagged=False)
    canonical = f"{base}@{ENGINE_LABELS.get(engine, engine)}" if at else base
    return RunSchedule(name=canonical, base=base, engine=engine, tagged=bool(at))


# --- the thermostat example's settings, read from its source ---------------------------------------------------------


def example_call(path: Path = THERMOSTAT_EXAMPLE) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments of the `run_learning_example(...)` call in an example script: literals
    as values, names resolved through the script's `from X import name` lines (so a suite-arguments class and the
    model constant come back as the objects themselves)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = {a.asname or a.name: (n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names}

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Name) and node.id in imported:
            module, attr = imported[node.id]
            return getattr(importlib.import_module(module), attr)
        return ast.literal_eval(node)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "run_learning_example":
            return [value(a) for a in node.args], {k.arg: value(k.value) for k in node.keywords}
    raise ValueError(f"{path}: no run_learning_example(...) call")


def thermostat_settings(path: Path = THERMOSTAT_EXAMPLE) -> dict[str, Any]:
    """The example's training settings (config keywords without folders and reporting; `max_steps` is the
    learning-rate schedule's length here), its suite and its model name (default: the suite's tiny agent, as
    `run_learning_example` picks it)."""
    from trl_thundersync.envs.suites import get_suite

    args, kwargs = example_call(path)
    config = {k: v for k, v in kwargs.items() if k not in _NOT_CONFIG}
    suite = get_suite(args[0])
    return {"suite": suite.name, "model": kwargs.get("model_name_or_path", suite.tiny_agent), "config": config,
            "schedule_steps": kwargs.get("max_steps")}


@dataclasses.dataclass(frozen=True)
class RealgenWorkload:
    """Knobs of a real-generation workload (defaults: the issue-10 SWE workload; `thermostat_workload` for the
    main job's)."""

    workload: str = "swe"
    steps: int = 4  # optimizer steps per run; the first is warm-up
    batch: int = 16
    group: int = 8
    max_completion_length: int = 256  # tokens per trajectory (TRL's budget: all turns and tool results)
    max_tool_calling_iterations: int = 5
    seed: int = 0
    num_tasks: int | None = None  # first N tasks (None: all)
    grading_workers: int | None = None  # ThunderSyncGRPOConfig.grading_workers of the ThunderSync schedules
    rollout_engine: str = "auto"  # the engine of schedules that do not name one

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def thermostat_workload(**overrides: Any) -> RealgenWorkload:
    """The main job's workload: batch, group and token budgets from `examples/thermostat_grpo.py`; `overrides` that
    are None keep those."""
    c = thermostat_settings()["config"]
    values = dict(workload="thermostat", batch=c["per_device_train_batch_size"], group=c["num_generations"],
                  max_completion_length=c["max_completion_length"],
                  max_tool_calling_iterations=c["max_tool_calling_iterations"])
    values.update({k: v for k, v in overrides.items() if v is not None})
    return RealgenWorkload(**values)


# --- what a run trains on --------------------------------------------------------------------------------------------


def _suite(w: RealgenWorkload):
    from trl_thundersync.envs.suites import load_suite

    return load_suite(w.workload, num_tasks=w.num_tasks)


def config_kwargs(w: RealgenWorkload, trainer: str = "thundersync") -> dict[str, Any]:
    """The config keywords of one run (without output_dir and the CPU base): the example's settings for
    `thermostat` (batch, group and budgets from `w`), realgen's issue-10 settings for `swe`. `trainer`: "trl" for
    stock `GRPOConfig` (no ThunderSync fields)."""
    common = dict(per_device_train_batch_size=w.batch, num_generations=w.group,
                  max_completion_length=w.max_completion_length,
                  max_tool_calling_iterations=w.max_tool_calling_iterations, seed=w.seed, logging_steps=1,
                  disable_tqdm=True)
    if w.workload == "thermostat":
        settings = thermostat_settings()
        # the learning-rate schedule of the example's run; the benchmark stops after w.steps (StopAt)
        out = {**settings["config"], **common, "max_steps": max(w.steps, settings["schedule_steps"] or w.steps)}
    else:
        from trl_thundersync.examples_support.arguments import LENGTH_PENALTY  # the examples' `shorter_is_better`

        out = {**common, "max_steps": w.steps, "learning_rate": 1e-5, "reward_weights": [LENGTH_PENALTY]}
        if trainer != "trl":
            out.update(learner_num_threads=1, rollout_num_threads=1)
    if trainer != "trl":
        out["grading_workers"] = w.grading_workers
    return out


def reward_funcs(w: RealgenWorkload) -> list:
    """The reward functions besides the environment's `get_reward`: none for thermostat (the example's)."""
    if w.workload == "thermostat":
        return []
    from trl_thundersync.examples_support.arguments import shorter_is_better

    return [shorter_is_better]


def grpo_config(w: RealgenWorkload, s: RunSchedule, out_dir: Path):
    """The `ThunderSyncGRPOConfig` of a sync/thundersync run of `s`, sampling with `s.engine`."""
    from benchmarks.parity import cpu_config
    from trl_thundersync.trainers.grpo.config import ThunderSyncGRPOConfig

    schedule, _, release = s.base.partition(":")
    return cpu_config(ThunderSyncGRPOConfig, out_dir, **config_kwargs(w), schedule=schedule,
                      release=release or DEFAULT_RELEASE, rollout_engine=s.engine)


def stop_after(w: RealgenWorkload) -> list:
    """Callbacks ending a run after `w.steps` optimizer steps when its schedule is longer (thermostat)."""
    from benchmarks.parity import StopAt

    return [StopAt(w.steps)]


def _model(w: RealgenWorkload, path: str):
    """What the trainer gets: the folder, as the thermostat example passes it; the FP32 model for swe (issue 10)."""
    if w.workload == "thermostat":
        return path
    from benchmarks.parity import load_model

    return load_model(path)


def build_grpo(w: RealgenWorkload, s: RunSchedule, model: str, out_dir: Path):
    from trl_thundersync.trainers.grpo.trainer import ThunderSyncGRPOTrainer

    suite = _suite(w)
    return ThunderSyncGRPOTrainer(model=_model(w, model), reward_funcs=reward_funcs(w), args=grpo_config(w, s, out_dir),
                                  train_dataset=suite.dataset, environment_factory=suite.environment_factory,
                                  callbacks=stop_after(w))


def build_trl_trainer(w: RealgenWorkload, trainer_cls: type, model: str, out_dir: Path):
    """Stock TRL (`trainer_cls`: a `trl.GRPOTrainer` subclass) on the same suite, rewards and config."""
    from trl import GRPOConfig

    from benchmarks.parity import cpu_config

    suite = _suite(w)
    return trainer_cls(model=_model(w, model), reward_funcs=reward_funcs(w), args=cpu_config(GRPOConfig, out_dir,
                                                                                 **config_kwargs(w, "trl")),
                       train_dataset=suite.dataset, environment_factory=suite.environment_factory,
                       callbacks=stop_after(w))


def build_gkd(w: RealgenWorkload, model: str, teacher: str, out_dir: Path):
    """`ThunderSyncGKDTrainer` on the SWE tasks (as `examples/swe_opd.py`): for the learner-tail comparison only."""
    from benchmarks.parity import load_model
    from trl_thundersync.trainers.gkd.config import ThunderSyncGKDConfig
    from trl_thundersync.trainers.gkd.trainer import ThunderSyncGKDTrainer

    suite = _suite(w)
    # cpu_config's base has GRPO-only fields (num_generations, max_completion_length): the same CPU settings here
    args = ThunderSyncGKDConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        gradient_checkpointing=False, per_device_train_batch_size=w.batch, max_steps=w.steps, learning_rate=1e-5,
        seed=w.seed, logging_steps=1, disable_tqdm=True, lmbda=1.0, objective="opd", schedule="thundersync",
        agent_protocol="trl", max_new_tokens=w.max_completion_length, rollout_engine=w.rollout_engine,
        max_tool_calling_iterations=w.max_tool_calling_iterations, learner_num_threads=1, rollout_num_threads=1)
    return ThunderSyncGKDTrainer(model=load_model(model), teacher_model=load_model(teacher), args=args,
                                 train_dataset=suite.dataset, environment_factory=suite.environment_factory)


def prepare_models(work: Path, w: RealgenWorkload, teacher: bool) -> tuple[str, str | None]:
    """The student (and, for gkd, the teacher) of `w`, built once in `work`: the SWE tiny agent (seed 0; teacher
    seed 1), or the thermostat example's model through `resolve_model` (as the example builds it)."""
    from trl_thundersync.tiny.agent import save_tiny_agent_model

    if w.workload == "thermostat":
        from trl_thundersync.examples_support.arguments import SuiteArguments
        from trl_thundersync.examples_support.plumbing import resolve_model

        settings = thermostat_settings()
        tiny_dir = work / SuiteArguments(suite=settings["suite"]).tiny_model_dir
        return resolve_model(settings["model"], str(tiny_dir)), None
    student = str(save_tiny_agent_model(work / "tiny-agent"))
    return student, str(save_tiny_agent_model(work / "tiny-agent-teacher", seed=1)) if teacher else None
