"""On-policy distillation on agentic tasks with sandboxed tools, streamed per agentic turn with ThunderSync: SWE-style
repair tasks by default, terminal tasks with `--suite terminal`.

Out of the box (CPU, offline): the tool-calling tiny agent (`tiny-agent`) distills a second tiny agent warm-started
with another seed (both built on first use) on the bundled tasks of the suite, with bubblewrap-sandboxed tools and
the embedded rollout engine. Each turn is scored by the teacher the moment its action is complete and the student's
backward for it runs while the tool executes. `--model_name_or_path tiny --teacher_model_name_or_path tiny` uses
random-weight tiny models instead (fast, but they never call a tool).

    python examples/swe_opd.py
    python examples/swe_opd.py --suite terminal
    python examples/swe_opd.py --max_steps 2 --schedule sync --objective gjsd
    python examples/swe_opd.py --swe_rows data.jsonl --swe_repo_root /path/to/repos   # your own SWE rows

A real run: `--model_name_or_path Qwen/Qwen3-1.7B --teacher_model_name_or_path Qwen/Qwen3-8B` (same tokenizer
family), `--use_peft --lora_r 16` for LoRA. `--objective opd` (default here) is the paper's sampled-token
objective; `--objective gjsd --beta 0.5` is GKD's generalized JSD over the full vocabulary.
The suite, its environment and data set come from `trl_thundersync.envs.suites` (any registered suite works with
`--suite`), the flags from `trl_thundersync.examples_support`; the run ends with a summary of its steps, objective
and timings, and where its trace and timeline were written.
"""

from __future__ import annotations

from trl import ModelConfig, TrlParser, get_peft_config

from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer
from trl_thundersync.examples_support.arguments import SuiteArguments, TinyTeacherArguments
from trl_thundersync.examples_support.plumbing import (
    chosen_suite,
    finish_distributed,
    resolve_model,
    resolve_teacher,
    set_script_defaults,
)
from trl_thundersync.examples_support.reports import report_run


def main() -> None:
    parser = TrlParser((SuiteArguments, TinyTeacherArguments, ThunderSyncGKDConfig, ModelConfig))
    suite_name = chosen_suite("swe")
    set_script_defaults(
        parser, suite=suite_name, model_name_or_path="tiny-agent", output_dir=f"outputs/{suite_name}_opd",
        per_device_train_batch_size=4, lmbda=1.0, objective="opd", max_new_tokens=96, agent_max_turns=6, max_steps=2,
        learning_rate=1e-5, logging_steps=1, report_to="none", save_strategy="no",
    )
    suite_args, teacher_args, training_args, model_args = parser.parse_args_and_config()
    suite = suite_args.load_suite()

    trainer = ThunderSyncGKDTrainer(
        model=resolve_model(model_args.model_name_or_path, suite_args.tiny_model_dir, training_args),
        teacher_model=resolve_teacher(training_args.teacher_model_name_or_path, teacher_args.tiny_teacher_dir,
                                      training_args),
        args=training_args,
        train_dataset=suite.dataset,
        peft_config=get_peft_config(model_args),
        environment_factory=suite.environment_factory,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    print(f"done: {trainer.state.global_step} optimizer steps on {len(suite.tasks)} tasks; "
          f"policy version {trainer.policy_version}")
    report_run(trainer)
    finish_distributed()


if __name__ == "__main__":
    main()
