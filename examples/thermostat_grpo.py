"""The quickstart: GRPO on the thermostat tasks — multi-turn, sandboxed tool use that a tiny agent learns on two CPU
cores in about three minutes, the model build and the vLLM server's start included (measured 2 min 47 s in a fresh
clone on 2026-12-05).

Each task hides a dial's level in a sandboxed workspace: the agent runs `./check`, then `./down` while it reads
`status: high` and `./up` while it reads `status: low`, then `submit()` at `status: ok`
(`trl_thundersync/envs/tasks/thermostat.py`; partial credit; the held-out tasks start farther from the target than
any trained on). Out of the box (CPU, offline): the 64-wide tiny agent warm-started on the suite's format with half
of its actions right (`tiny-agent-thermostat`, built on first use in under a minute), bubblewrap-sandboxed shell
tools, rollouts from a real `vllm serve` the trainer starts and stops (`rollout_engine="auto"` → `managed_vllm` when
`scripts/setup.sh` installed `.venv-vllm`; else the embedded server; `--rollout_engine embedded_server` to choose
it), gradient streaming. The training reward climbs from ~0.65 to ~0.9, and held-out success rises with it
(BENCHMARKS.md, "Time to quality on the thermostat tasks").

    accelerate launch examples/thermostat_grpo.py
    python examples/thermostat_grpo.py --max_steps 40            # longer
    python examples/thermostat_grpo.py --schedule sync --eval_samples 0

The run ends with a summary: training reward over the first and last steps, held-out success before and after
training (episodes sampled at the training temperature by the run's own rollout servers; `--eval_samples 0` skips
it), the timing summary of the other examples, and the path of a reward-versus-time plot in the output directory.
"""

from trl_thundersync.examples_support.reports import run_learning_example

if __name__ == "__main__":
    run_learning_example(
        "thermostat", output_dir="outputs/thermostat_grpo", per_device_train_batch_size=32, num_generations=8,
        max_completion_length=448, max_tool_calling_iterations=6, max_steps=12, learning_rate=6e-4, beta=0.0,
        temperature=0.7, logging_steps=1, report_to="none", save_strategy="no",
    )
