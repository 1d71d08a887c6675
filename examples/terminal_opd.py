"""On-policy distillation on terminal tasks with a sandboxed shell, streamed per agentic turn with ThunderSync.

Out of the box (CPU, offline): the tool-calling tiny agent (`tiny-agent`) distills a second tiny agent warm-started
with another seed (both built on first use) on the bundled terminal tasks, with bubblewrap-sandboxed shell tools and
the embedded rollout engine. Each turn is scored by the teacher the moment its action is complete and the student's
backward for it runs while the shell command executes. `--model_name_or_path tiny --teacher_model_name_or_path tiny`
uses random-weight tiny models instead (fast, but they never call a tool).

    python examples/terminal_opd.py
    python examples/terminal_opd.py --max_steps 2 --schedule sync --objective gjsd

A real run: `--model_name_or_path Qwen/Qwen3-1.7B --teacher_model_name_or_path Qwen/Qwen3-8B` (same tokenizer
family), `--use_peft --lora_r 16` for LoRA. `--objective opd` (default here) is the paper's sampled-token
objective; `--objective gjsd --beta 0.5` is GKD's generalized JSD over the full vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer
from trl_thundersync.scripts import finish_distributed, resolve_model, resolve_teacher, set_script_defaults


@dataclass
class TerminalArguments(ScriptArguments):
    tiny_model_dir: str = field(default="tiny-agent", metadata={"help": "Where the offline tiny student is created."})
    tiny_teacher_dir: str = field(default="tiny-agent-teacher",
                                  metadata={"help": "Where the offline tiny teacher is created."})
    num_tasks: int | None = field(default=None, metadata={"help": "Use only the first N tasks."})


def main() -> None:
    parser = TrlParser((TerminalArguments, ThunderSyncGKDConfig, ModelConfig))
    set_script_defaults(
        parser, model_name_or_path="tiny-agent", output_dir="outputs/terminal_opd", per_device_train_batch_size=4,
        lmbda=1.0, objective="opd", max_new_tokens=96, agent_max_turns=6, max_steps=2, learning_rate=1e-5,
        logging_steps=1, report_to="none", save_strategy="no",
    )
    script_args, training_args, model_args = parser.parse_args_and_config()

    from trl_thundersync.envs.tasks import load_terminal_suite, terminal_dataset
    from trl_thundersync.envs.terminal import TerminalTaskEnv

    tasks = load_terminal_suite()
    if script_args.num_tasks:
        tasks = dict(list(tasks.items())[: script_args.num_tasks])
    trainer = ThunderSyncGKDTrainer(
        model=resolve_model(model_args.model_name_or_path, script_args.tiny_model_dir),
        teacher_model=resolve_teacher(training_args.teacher_model_name_or_path, script_args.tiny_teacher_dir),
        args=training_args,
        train_dataset=terminal_dataset(tasks),
        peft_config=get_peft_config(model_args),
        environment_factory=lambda: TerminalTaskEnv(tasks),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    print(f"done: {trainer.state.global_step} optimizer steps on {len(tasks)} tasks; "
          f"policy version {trainer.policy_version}")
    finish_distributed()


if __name__ == "__main__":
    main()
