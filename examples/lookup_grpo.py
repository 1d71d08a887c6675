"""GRPO on the lookup tasks — multi-turn tool use sized for a tiny model on two CPU cores (issue 15).

Each task hides a chain of pointers in a sandboxed workspace: the agent must `cat input.txt`, then run the command
each tool result names (`ls <dir>`), then `submit` (`trl_thundersync/envs/tasks/lookup.py`; partial credit, held-out
chains never trained on). Out of the box (CPU, offline): a 128-wide tiny agent warm-started on following pointers
over the train chains (`tiny-agent-lookup`, built on first use; held-out success ~0.46 after it), bubblewrap-sandboxed
shell tools, the embedded rollout server, gradient streaming. Status: over the default 30 steps the training reward
stays where the warm start left it (~0.7, noisy); BENCHMARKS.md "Issue 15" has the runs.

    accelerate launch examples/lookup_grpo.py
    python examples/lookup_grpo.py --max_steps 80          # longer
    python examples/lookup_grpo.py --schedule sync --eval_samples 0

The run ends with a summary: training reward over the first and last steps, held-out success before and after
training (sampled episodes on the held-out chains; `--eval_samples 0` skips it), the timing summary of the other
examples, and the path of a reward-versus-time plot in the output directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import ModelConfig, TrlParser, get_peft_config

from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.agentic import LookupSuiteArguments
from trl_thundersync.example_support import (
    TINY_AGENT_LOOKUP,
    finish_distributed,
    report_learning,
    report_run,
    resolve_model,
    set_script_defaults,
)
from trl_thundersync.learning import LearningCurve


@dataclass
class LookupRunArguments:
    """Held-out evaluation of the lookup example."""

    eval_samples: int = field(default=2, metadata={"help": "Sampled episodes per held-out task before and after "
                                                           "training (0: no held-out evaluation)."})


def main() -> None:
    parser = TrlParser((LookupSuiteArguments, LookupRunArguments, ThunderSyncGRPOConfig, ModelConfig))
    set_script_defaults(
        parser, model_name_or_path=TINY_AGENT_LOOKUP, output_dir="outputs/lookup_grpo",
        per_device_train_batch_size=16, num_generations=8, max_completion_length=512,
        max_tool_calling_iterations=6, max_steps=30, learning_rate=2e-4, beta=0.0, temperature=1.0,
        logging_steps=1, report_to="none", save_strategy="no",
    )
    suite_args, run_args, training_args, model_args = parser.parse_args_and_config()
    suite = suite_args.load_suite()
    model = resolve_model(model_args.model_name_or_path, suite_args.tiny_model_dir, training_args)
    curve = LearningCurve(evaluate=heldout_success(run_args.eval_samples), every=max(1, training_args.max_steps))

    trainer = ThunderSyncGRPOTrainer(
        model=model, reward_funcs=[], args=training_args, train_dataset=suite.dataset,
        peft_config=get_peft_config(model_args), environment_factory=suite.environment_factory, callbacks=[curve],
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    print(f"done: {trainer.state.global_step} optimizer steps on {len(suite.tasks)} lookup tasks; "
          f"policy version {trainer.policy_version}")
    report_run(trainer)
    report_learning(trainer, curve)
    finish_distributed()


def heldout_success(samples: int):
    """`(model, tokenizer) -> held-out success` (`lookup_eval.evaluate_lookup`), or None when `samples` is 0."""
    if samples <= 0:
        return None
    from trl_thundersync.lookup_eval import evaluate_lookup

    return lambda model, tokenizer: evaluate_lookup(model, tokenizer, split="heldout", samples=samples).success


if __name__ == "__main__":
    main()
