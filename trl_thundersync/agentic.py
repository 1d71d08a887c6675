"""The agentic workloads of the examples: a task suite with its sandboxed environment and TRL data set, the flags
that pick it, and the GRPO examples' length-shaping reward — so each example script holds only its trainer.

    suite = load_suite("swe", num_tasks=8)                 # or "terminal"; swe_rows=... for your own SWE rows
    trainer = ThunderSyncGRPOTrainer(..., train_dataset=suite.dataset, environment_factory=suite.environment_factory)

Example scripts parse the flags with TRL's parser, next to the trainer's config:

    parser = TrlParser((SWESuiteArguments, LengthShapingArguments, ThunderSyncGRPOConfig, ModelConfig))
    suite_args, shaping_args, training_args, model_args = parser.parse_args_and_config()
    suite = suite_args.load_suite()

The default model of these examples is `tiny-agent` (`scripts.resolve_model`: the offline tiny model warm-started to
call tools, `tiny/agent.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from trl import ScriptArguments

from .errors import ConfigurationError

if TYPE_CHECKING:
    from datasets import Dataset

SuiteName = Literal["swe", "terminal", "lookup", "thermostat"]
SUITES: tuple[SuiteName, ...] = ("swe", "terminal", "lookup", "thermostat")
TINY_AGENT = "tiny-agent"  # the agentic examples' default --model_name_or_path (built offline on first use)
LENGTH_PENALTY = 0.001  # the GRPO examples' default weight of `shorter_is_better`


@dataclass(frozen=True)
class TaskSuite:
    """The tasks of one run and what a trainer needs from them."""

    name: SuiteName  # which environment the tasks run in
    tasks: Mapping[str, Any]  # task id → SWETask / TerminalTask, in suite order (after --num_tasks)
    dataset: Dataset  # one row per task: "prompt" (chat messages) and "task_id" (what the environment's reset gets)
    environment_factory: Callable[[], Any]  # TRL's environment_factory: a fresh sandboxed environment per call


def load_suite(name: SuiteName, *, num_tasks: int | None = None, swe_rows: str | None = None,
               swe_repo_root: str | None = None) -> TaskSuite:
    """The bundled `name` suite (or, for "swe", the SWE-smith / SWE-bench style rows in `swe_rows` with local
    checkouts under `swe_repo_root`), cut to its first `num_tasks` tasks when that is given (0 or None: all)."""
    from .envs.tasks import load_swe_rows, load_swe_suite, load_terminal_suite, swe_dataset, terminal_dataset

    if name == "swe":
        from .envs.environments.swe import SWERepairEnv

        tasks = load_swe_rows(swe_rows, swe_repo_root) if swe_rows else load_swe_suite()
        environment, to_dataset = SWERepairEnv, swe_dataset
    elif name == "terminal":
        from .envs.environments.terminal import TerminalTaskEnv

        if swe_rows or swe_repo_root:
            raise ConfigurationError("swe_rows / swe_repo_root are SWE rows; the terminal suite has bundled tasks only")
        tasks = load_terminal_suite()
        environment, to_dataset = TerminalTaskEnv, terminal_dataset
    elif name == "lookup":  # the pointer chains a tiny agent learns on CPU (envs/tasks/lookup.py); train split
        from .envs.environments.lookup import LookupTaskEnv
        from .envs.tasks.lookup import load_lookup_suite, lookup_dataset

        if swe_rows or swe_repo_root:
            raise ConfigurationError("swe_rows / swe_repo_root are SWE rows; the lookup suite has bundled tasks only")
        tasks, environment, to_dataset = load_lookup_suite("train"), LookupTaskEnv, lookup_dataset
    elif name == "thermostat":  # the dial a tiny agent learns to steer on CPU (envs/tasks/thermostat.py); train split
        from .envs.environments.thermostat import ThermostatTaskEnv
        from .envs.tasks.thermostat import load_thermostat_suite, thermostat_dataset

        if swe_rows or swe_repo_root:
            raise ConfigurationError("swe_rows / swe_repo_root are SWE rows; the thermostat suite has bundled tasks "
                                     "only")
        tasks, environment, to_dataset = load_thermostat_suite("train"), ThermostatTaskEnv, thermostat_dataset
    else:
        raise ConfigurationError(f"suite={name!r} is not one of {SUITES}")
    if num_tasks:
        tasks = dict(list(tasks.items())[:num_tasks])
    return TaskSuite(name=name, tasks=tasks, dataset=to_dataset(tasks),
                     environment_factory=functools.partial(environment, tasks))


def shorter_is_better(completion_ids, **kwargs) -> list[float]:
    """Minus the completion length: a dense shaping term next to the environment's pass/fail reward."""
    return [-float(len(ids)) for ids in completion_ids]


def length_shaping(length_penalty: float, training_args) -> list[Callable]:
    """The GRPO examples' reward functions besides the environment's own: `[shorter_is_better]`, or none when
    `length_penalty` is 0. Sets `training_args.reward_weights` to `[length_penalty]` unless the user gave weights
    (TRL appends the environment's `get_reward` with weight 1)."""
    if not length_penalty:
        return []
    if training_args.reward_weights is None:
        training_args.reward_weights = [length_penalty]
    return [shorter_is_better]


# -- command-line flags (TRL's HfArgumentParser dataclasses) -----------------------------------------------------


@dataclass
class SuiteArguments(ScriptArguments):
    """Flags every agentic example has; use `SWESuiteArguments` or `TerminalSuiteArguments`."""

    suite: ClassVar[SuiteName]
    tiny_model_dir: str = field(
        default=TINY_AGENT, metadata={"help": "Where the offline tiny model (the student, when distilling) is created."}
    )
    num_tasks: int | None = field(default=None, metadata={"help": "Use only the first N tasks."})

    def load_suite(self) -> TaskSuite:
        return load_suite(self.suite, num_tasks=self.num_tasks)


@dataclass
class TerminalSuiteArguments(SuiteArguments):
    """The bundled terminal tasks (SETA / Terminal-Bench style)."""

    suite: ClassVar[SuiteName] = "terminal"


@dataclass
class LookupSuiteArguments(SuiteArguments):
    """The bundled lookup tasks: follow pointers through the sandbox (a task the tiny agent learns on CPU)."""

    suite: ClassVar[SuiteName] = "lookup"
    tiny_model_dir: str = field(  # its own folder: the lookup warm start would otherwise rebuild `tiny-agent`
        default="tiny-agent-lookup", metadata={"help": "Where the offline tiny lookup agent is created."}
    )


@dataclass
class ThermostatSuiteArguments(SuiteArguments):
    """The bundled thermostat tasks: steer a sandboxed dial to its target (the quickstart's task)."""

    suite: ClassVar[SuiteName] = "thermostat"
    tiny_model_dir: str = field(  # its own folder: this warm start would otherwise rebuild `tiny-agent`
        default="tiny-agent-thermostat", metadata={"help": "Where the offline tiny thermostat agent is created."}
    )


@dataclass
class SWESuiteArguments(SuiteArguments):
    """The bundled SWE-style repair tasks, or your own SWE-smith / SWE-bench rows."""

    suite: ClassVar[SuiteName] = "swe"
    swe_rows: str | None = field(default=None, metadata={"help": "SWE-smith / SWE-bench style JSON or JSONL rows."})
    swe_repo_root: str | None = field(default=None, metadata={"help": "Local checkouts for --swe_rows."})

    def load_suite(self) -> TaskSuite:
        return load_suite("swe", num_tasks=self.num_tasks, swe_rows=self.swe_rows, swe_repo_root=self.swe_repo_root)


@dataclass
class LengthShapingArguments:
    """The GRPO examples' shaping term (`length_shaping`)."""

    length_penalty: float = field(
        default=LENGTH_PENALTY,
        metadata={"help": "Weight of a small per-token penalty that shapes the reward (0 disables)."},
    )


@dataclass
class HeldOutArguments:
    """Held-out evaluation of the examples that show learning (`example_support.run_learning_example`)."""

    eval_samples: int = field(default=4, metadata={"help": "Sampled episodes per held-out task before and after "
                                                           "training (0: no held-out evaluation)."})
    eval_every: int | None = field(default=None, metadata={"help": "Also evaluate after every N optimizer steps "
                                                                   "(default: only before and after training)."})

    def evaluator(self, suite: str, temperature: float,
                  generator: Callable[[], Any] | None = None) -> Callable[[Any, Any], float] | None:
        """`(model, tokenizer) -> held-out success` on `suite` (`suite_eval.evaluate_suite`), or None when
        eval_samples is 0. `generator`: returns the run's turn generator (`trainer.evaluation_generator`), which then
        samples the episodes (None from it: the model's own `generate`)."""
        if self.eval_samples < 0 or (self.eval_every is not None and self.eval_every < 1):
            raise ConfigurationError(f"eval_samples={self.eval_samples} must be >= 0 and eval_every="
                                     f"{self.eval_every} >= 1")
        if self.eval_samples == 0:
            return None
        from .suite_eval import evaluate_suite

        samples = self.eval_samples
        return lambda model, tokenizer: evaluate_suite(
            model, tokenizer, suite, split="heldout", samples=samples, temperature=temperature,
            generator=generator() if generator is not None else None).success


@dataclass
class TinyTeacherArguments:
    """The distillation examples' offline teacher (`scripts.resolve_teacher`)."""

    tiny_teacher_dir: str = field(default="tiny-agent-teacher",
                                  metadata={"help": "Where the offline tiny teacher is created."})
