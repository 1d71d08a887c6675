"""The example scripts' flags (TRL's HfArgumentParser dataclasses) and the GRPO examples' length-shaping reward.

    parser = TrlParser((SuiteArguments, LengthShapingArguments, ThunderSyncGRPOConfig, ModelConfig))
    suite_args, shaping_args, training_args, model_args = parser.parse_args_and_config()
    suite = suite_args.load_suite()          # --suite swe|terminal|lookup|thermostat (or a suite you registered)
    trainer = ThunderSyncGRPOTrainer(..., train_dataset=suite.dataset, environment_factory=suite.environment_factory)

The suites themselves (tasks, environment, prompt) are `trl_thundersync.envs.suites` records; the default model of
the agentic examples is `tiny-agent` (`plumbing.resolve_model`: the offline tiny model warm-started to call tools,
`tiny/agent.py`), or the suite's own warm-started tiny agent (`Suite.tiny_agent`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trl import ScriptArguments

from ..envs.suites import TaskSuite, get_suite, load_suite
from ..errors import ConfigurationError

TINY_AGENT = "tiny-agent"  # the agentic examples' default --model_name_or_path (built offline on first use)
LENGTH_PENALTY = 0.001  # the GRPO examples' default weight of `shorter_is_better`


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


@dataclass
class SuiteArguments(ScriptArguments):
    """Which task suite an agentic example trains on, and where its offline tiny model is built."""

    suite: str = field(default="swe", metadata={"help": "The task suite: swe, terminal, lookup, thermostat, or one "
                                                        "registered with envs.suites.register_suite."})
    tiny_model_dir: str | None = field(
        default=None, metadata={"help": "Where the offline tiny model (the student, when distilling) is created "
                                        "(default: the suite's own tiny agent folder, else tiny-agent)."})
    num_tasks: int | None = field(default=None, metadata={"help": "Use only the first N tasks."})
    swe_rows: str | None = field(default=None, metadata={"help": "SWE-smith / SWE-bench style JSON or JSONL rows "
                                                                 "(--suite swe)."})
    swe_repo_root: str | None = field(default=None, metadata={"help": "Local checkouts for --swe_rows."})

    def __post_init__(self) -> None:
        if self.tiny_model_dir is None:  # a suite's warm-started agent gets its own folder: not `tiny-agent` rebuilt
            self.tiny_model_dir = get_suite(self.suite).tiny_agent or TINY_AGENT

    def load_suite(self) -> TaskSuite:
        return load_suite(self.suite, num_tasks=self.num_tasks, swe_rows=self.swe_rows,
                          swe_repo_root=self.swe_repo_root)


@dataclass
class LengthShapingArguments:
    """The GRPO examples' shaping term (`length_shaping`)."""

    length_penalty: float = field(
        default=LENGTH_PENALTY,
        metadata={"help": "Weight of a small per-token penalty that shapes the reward (0 disables)."},
    )


@dataclass
class HeldOutArguments:
    """Held-out evaluation of the examples that show learning (`reports.run_learning_example`)."""

    eval_samples: int = field(default=4, metadata={"help": "Sampled episodes per held-out task before and after "
                                                           "training (0: no held-out evaluation)."})
    eval_every: int | None = field(default=None, metadata={"help": "Also evaluate after every N optimizer steps "
                                                                   "(default: only before and after training)."})

    def evaluator(self, suite: str, temperature: float,
                  generator: Callable[[], Any] | None = None) -> Callable[[Any, Any], float] | None:
        """`(model, tokenizer) -> held-out success` on `suite` (`envs.suites.evaluate.evaluate_suite`), or None when
        eval_samples is 0. `generator`: returns the run's turn generator (`trainer.evaluation_generator`), which then
        samples the episodes (None from it: the model's own `generate`)."""
        if self.eval_samples < 0 or (self.eval_every is not None and self.eval_every < 1):
            raise ConfigurationError(f"eval_samples={self.eval_samples} must be >= 0 and eval_every="
                                     f"{self.eval_every} >= 1")
        if self.eval_samples == 0:
            return None
        from ..envs.suites.evaluate import evaluate_suite

        samples = self.eval_samples
        return lambda model, tokenizer: evaluate_suite(
            model, tokenizer, suite, split="heldout", samples=samples, temperature=temperature,
            generator=generator() if generator is not None else None).success


@dataclass
class TinyTeacherArguments:
    """The distillation examples' offline teacher (`plumbing.resolve_teacher`)."""

    tiny_teacher_dir: str = field(default="tiny-agent-teacher",
                                  metadata={"help": "Where the offline tiny teacher is created."})
