"""The example scripts' end of run: the timing summary with its trace files, the learning summary and plot, and the
body of the examples that show learning (`run_learning_example`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def report_run(trainer):
    """Print the end-of-run summary (`trace.summary`) on the main process, after writing a Chrome/Perfetto trace and
    a timeline PNG of the last steps beside the run's trace (`<output_dir>/thundersync_trace/`); returns the
    `RunSummary` (None on other processes)."""
    from ..trace.export import read_jsonl
    from ..trace.recorder import TRACE_FILE
    from ..trace.summary import export_run, format_summary, summarize_run

    if not trainer.accelerator.is_main_process:
        return None
    trace = Path(trainer.args.output_dir) / TRACE_FILE
    steps = read_jsonl(trace) if getattr(trainer.args, "trace", False) and trace.exists() else []
    files = ([("trace (one JSON line per step)", trace), *export_run(steps, trace.parent)] if steps else [])
    summary = summarize_run(steps, trainer.state.log_history, optimizer_steps=trainer.state.global_step, files=files)
    print(format_summary(summary), flush=True)
    return summary


LEARNING_PLOT = "reward_vs_time.png"  # report_learning's plot, in the output directory
SUMMARY_WINDOW = 5  # report_learning compares the mean reward of the first and last N steps


def report_learning(trainer, curve) -> Path | None:
    """Print what the run learned (`learning.LearningCurve` `curve`): mean training reward over the first and last
    SUMMARY_WINDOW steps, held-out score before and after when it was evaluated, and the path of the
    reward-versus-time plot written to the output directory; returns that path (None on other processes)."""
    from ..learning import plot_curves, window_means

    if not trainer.accelerator.is_main_process:
        return None
    first, last = window_means(curve.points, SUMMARY_WINDOW)
    k = max(1, min(SUMMARY_WINDOW, len(curve.points) // 2))
    lines = [f"learning: training reward {first:.3f} (mean of the first {k} steps) -> {last:.3f} (last {k}), "
             f"{curve.points[-1].seconds:.0f} s of training"]
    if len(curve.heldout) >= 2:
        (_, _, before), (_, _, after) = curve.heldout[0], curve.heldout[-1]
        lines.append(f"held-out success: {before:.2f} before training -> {after:.2f} after "
                     f"({curve.evaluated_s:.0f} s evaluating, not counted above)")
    plot = plot_curves({"training reward": curve.points}, Path(trainer.args.output_dir) / LEARNING_PLOT)
    lines.append(f"reward-versus-time plot: {plot}")
    print("\n".join(lines), flush=True)
    return plot


def run_learning_example(suite: str, **defaults: Any) -> None:
    """The body of the GRPO examples that show learning (`examples/thermostat_grpo.py`, `examples/lookup_grpo.py`):
    parse `SuiteArguments` (`--suite` defaults to `suite`), `HeldOutArguments`, `ThunderSyncGRPOConfig` and TRL's
    `ModelConfig` (the script's `defaults` first; the model defaults to the suite's warm-started tiny agent,
    `Suite.tiny_agent`), train on the suite's training split with the environment's reward only, evaluate its
    held-out split before and after training (at the run's sampling temperature, clock stopped), then print the run
    and learning summaries and write the reward-versus-time plot."""
    from trl import ModelConfig, TrlParser, get_peft_config

    from .. import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
    from ..envs.suites import get_suite
    from ..learning import LearningCurve
    from .arguments import HeldOutArguments, SuiteArguments
    from .plumbing import finish_distributed, resolve_model, set_script_defaults

    parser = TrlParser((SuiteArguments, HeldOutArguments, ThunderSyncGRPOConfig, ModelConfig))
    set_script_defaults(parser, **{"suite": suite, "model_name_or_path": get_suite(suite).tiny_agent, **defaults})
    suite_args, heldout_args, training_args, model_args = parser.parse_args_and_config()
    tasks = suite_args.load_suite()
    model = resolve_model(model_args.model_name_or_path, suite_args.tiny_model_dir, training_args)
    curve = LearningCurve(every=max(1, heldout_args.eval_every or training_args.max_steps))
    trainer = ThunderSyncGRPOTrainer(
        model=model, reward_funcs=[], args=training_args, train_dataset=tasks.dataset,
        peft_config=get_peft_config(model_args), environment_factory=tasks.environment_factory, callbacks=[curve],
    )
    # held-out episodes are sampled by the run's own rollout engine (its vLLM or embedded servers, at the current
    # policy version, concurrently); the first evaluation starts it, so its start-up is not counted as training time
    curve.evaluate = heldout_args.evaluator(suite_args.suite, training_args.temperature,
                                            generator=trainer.evaluation_generator)
    trainer.train()
    trainer.save_model(training_args.output_dir)
    print(f"done: {trainer.state.global_step} optimizer steps on {len(tasks.tasks)} {tasks.name} tasks; "
          f"policy version {trainer.policy_version}")
    report_run(trainer)
    report_learning(trainer, curve)
    finish_distributed()
