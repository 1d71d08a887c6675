"""Shared plumbing of the example scripts: CPU-friendly defaults, the offline tiny models, the end-of-run summary.

Kept in the package (not in `examples/`) so that `python examples/x.py` and `accelerate launch examples/x.py`
import it the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

TINY_AGENT_LOOKUP = "tiny-agent-lookup"  # the lookup example's default model (and folder): `resolve_model`
TINY_AGENT_THERMOSTAT = "tiny-agent-thermostat"  # the quickstart (thermostat) example's default model and folder


def set_script_defaults(parser, **defaults: Any) -> None:
    """Defaults applied before parsing, so a script runs with no arguments: on a machine without CUDA it trains on
    the CPU in FP32 (TRL's GRPOConfig defaults to bf16, which a CPU run refuses), plus the script's own defaults.
    Command-line flags and `--config` files still override all of them."""
    if not torch.cuda.is_available():
        defaults = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, **defaults}
    parser.set_defaults(**defaults)


def resolve_model(name: str | None, tiny_dir: str = "tiny-qwen3", args=None) -> str:
    """`tiny` (or nothing) → the offline random-weight tiny model under `tiny_dir`; `tiny-agent` → the tiny model
    warm-started to call tools (built once, under a minute on two cores, with a progress bar); `tiny-agent-lookup`
    → a wider tiny agent warm-started on the lookup suite instead (`save_tiny_agent_model(lookup=True)`);
    `tiny-agent-thermostat` → the tiny agent warm-started on the thermostat suite (`thermostat=True`, about a
    minute on two cores); anything else is returned unchanged. `args` (the run's TrainingArguments): under a
    multi-process launch the local main process builds the folder, showing progress, while the other processes
    wait and then reuse it."""
    if name in (None, "", "tiny"):
        from .tiny.model import save_tiny_model

        return _build_once(args, lambda progress: save_tiny_model(tiny_dir))
    if name == "tiny-agent":
        from .tiny.agent import save_tiny_agent_model

        return _build_once(args, lambda progress: save_tiny_agent_model(tiny_dir, progress=progress))
    if name == TINY_AGENT_LOOKUP:
        from .tiny.agent import LOOKUP_HIDDEN, save_tiny_agent_model

        return _build_once(args, lambda progress: save_tiny_agent_model(tiny_dir, progress=progress, lookup=True,
                                                                        hidden_size=LOOKUP_HIDDEN))
    if name == TINY_AGENT_THERMOSTAT:
        from .tiny.agent import save_tiny_agent_model

        return _build_once(args, lambda progress: save_tiny_agent_model(tiny_dir, progress=progress, thermostat=True))
    return name


def _build_once(args, build: Callable[[bool], Path]) -> str:
    """`build(progress)` on the local main process first (the others then find the folder built), progress shown
    there only; without `args` (or with one process) just `build(True)`."""
    if args is None or getattr(args, "world_size", 1) <= 1:
        return str(build(True))
    with args.main_process_first(local=True, desc="building the offline tiny model"):
        return str(build(args.local_process_index == 0))


def finish_distributed() -> None:
    """Tear down torch.distributed cleanly (a leftover process group can abort the interpreter's exit)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def resolve_teacher(name: str | None, tiny_dir: str = "tiny-agent-teacher", args=None) -> str:
    """The teacher of the distillation examples: `tiny-agent` (or nothing) → a second tool-calling tiny agent,
    warm-started with another seed (built once, under a minute on two cores); `tiny` → a random-weight tiny
    teacher, wider and deeper than the tiny student; anything else is returned unchanged. All share the student's
    tokenizer. `args`: as for `resolve_model`."""
    if name in (None, "", "tiny-agent"):
        from .tiny.agent import save_tiny_agent_model

        return _build_once(args, lambda progress: save_tiny_agent_model(tiny_dir, seed=1, progress=progress))
    if name == "tiny":
        from .tiny.model import save_tiny_model

        return _build_once(args, lambda progress: save_tiny_model(tiny_dir, hidden_size=96, num_layers=3, seed=7))
    return name


def report_run(trainer):
    """Print the end-of-run summary (`trace.summary`) on the main process, after writing a Chrome/Perfetto trace and
    a timeline PNG of the last steps beside the run's trace (`<output_dir>/thundersync_trace/`); returns the
    `RunSummary` (None on other processes)."""
    from .trace.export import read_jsonl
    from .trace.recorder import TRACE_FILE
    from .trace.summary import export_run, format_summary, summarize_run

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
    from .learning import plot_curves, window_means

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


def run_learning_example(suite_arguments: type, eval_suite: str, **defaults: Any) -> None:
    """The body of the GRPO examples that show learning (`examples/thermostat_grpo.py`, `examples/lookup_grpo.py`):
    parse the suite's flags, `HeldOutArguments`, `ThunderSyncGRPOConfig` and TRL's `ModelConfig` (the script's
    `defaults` first), train on the suite's train split with the environment's reward only, evaluate `eval_suite`'s
    held-out split before and after training (at the run's sampling temperature, clock stopped), then print the run
    and learning summaries and write the reward-versus-time plot."""
    from trl import ModelConfig, TrlParser, get_peft_config

    from . import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
    from .agentic import HeldOutArguments
    from .learning import LearningCurve

    parser = TrlParser((suite_arguments, HeldOutArguments, ThunderSyncGRPOConfig, ModelConfig))
    set_script_defaults(parser, **defaults)
    suite_args, heldout_args, training_args, model_args = parser.parse_args_and_config()
    suite = suite_args.load_suite()
    model = resolve_model(model_args.model_name_or_path, suite_args.tiny_model_dir, training_args)
    curve = LearningCurve(every=max(1, heldout_args.eval_every or training_args.max_steps))
    trainer = ThunderSyncGRPOTrainer(
        model=model, reward_funcs=[], args=training_args, train_dataset=suite.dataset,
        peft_config=get_peft_config(model_args), environment_factory=suite.environment_factory, callbacks=[curve],
    )
    # held-out episodes are sampled by the run's own rollout engine (its vLLM or embedded servers, at the current
    # policy version, concurrently); the first evaluation starts it, so its start-up is not counted as training time
    curve.evaluate = heldout_args.evaluator(eval_suite, training_args.temperature,
                                            generator=trainer.evaluation_generator)
    trainer.train()
    trainer.save_model(training_args.output_dir)
    print(f"done: {trainer.state.global_step} optimizer steps on {len(suite.tasks)} {suite.name} tasks; "
          f"policy version {trainer.policy_version}")
    report_run(trainer)
    report_learning(trainer, curve)
    finish_distributed()
