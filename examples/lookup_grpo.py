"""GRPO on the lookup tasks — a harder multi-turn tool-use family than the quickstart's thermostat (issue 15).

Each task hides a chain of pointers in a sandboxed workspace: the agent must `cat input.txt`, then run the command
each tool result names (`ls <dir>`), then `submit` (`trl_thundersync/envs/tasks/lookup.py`; partial credit, held-out
chains never trained on). Out of the box (CPU, offline): a 128-wide tiny agent warm-started on following pointers
over the train chains (`tiny-agent-lookup`, built on first use in 4-6 minutes; held-out success ~0.46 after it),
bubblewrap-sandboxed shell tools, the embedded rollout server, gradient streaming. Status: over the default 30 steps
the training reward stays where the warm start left it (~0.7, noisy); BENCHMARKS.md "Issue 15" has the runs.

    accelerate launch examples/lookup_grpo.py
    python examples/lookup_grpo.py --max_steps 80          # longer

The summary at the end is the thermostat example's (`examples_support.reports.run_learning_example`).
"""

from trl_thundersync.examples_support.reports import run_learning_example

if __name__ == "__main__":
    run_learning_example(
        "lookup", output_dir="outputs/lookup_grpo",
        per_device_train_batch_size=16, num_generations=8, max_completion_length=512, max_tool_calling_iterations=6,
        max_steps=30, learning_rate=2e-4, beta=0.0, temperature=1.0, logging_steps=1, report_to="none",
        save_strategy="no",
    )
