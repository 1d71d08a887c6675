"""GRPO on agentic tasks with tools in a sandbox, streamed with ThunderSync: SWE-style repair tasks by default,
terminal tasks (SETA / Terminal-Bench style) with `--suite terminal`.

Out of the box (CPU, offline): the tiny model warm-started to call tools (`tiny-agent`, built on first use),
the bundled tasks of the suite, bubblewrap-sandboxed shell tools and the embedded rollout server (started for the
run). Terminal reward: p + 0.5·[p = 1], p = fraction of verifier checks passed (the paper's SETA reward).

    accelerate launch examples/swe_grpo.py
    accelerate launch examples/swe_grpo.py --suite terminal
    python examples/swe_grpo.py --max_steps 2 --schedule sync

A real run: `--model_name_or_path Qwen/Qwen3-8B` (or a local folder), `--use_peft --lora_r 16` for LoRA, and your
own SWE-smith / SWE-bench rows with local checkouts: `--swe_rows data.jsonl --swe_repo_root /path/to/repos`.
vLLM: start `vllm serve` (see README, "Rollout servers") and add `--use_vllm --vllm_mode server
--vllm_server_base_url http://HOST:8000` (or `--vllm_server_base_urls URL1 URL2` for several replicas).
The suite, its environment and data set come from `trl_thundersync.envs.suites` (any registered suite works with
`--suite`), the flags and the length-shaping reward from `trl_thundersync.examples_support`; the run ends with a
summary of its steps, rewards and timings, and where its trace and timeline were written.
"""

from __future__ import annotations

from trl import ModelConfig, TrlParser, get_peft_config

from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.examples_support.arguments import LengthShapingArguments, SuiteArguments, length_shaping
from trl_thundersync.examples_support.plumbing import (
    chosen_suite,
    finish_distributed,
    resolve_model,
    set_script_defaults,
)
from trl_thundersync.examples_support.reports import report_run


def main() -> None:
    parser = TrlParser((SuiteArguments, LengthShapingArguments, ThunderSyncGRPOConfig, ModelConfig))
    suite_name = chosen_suite("swe")
    set_script_defaults(
        parser, suite=suite_name, model_name_or_path="tiny-agent", output_dir=f"outputs/{suite_name}_grpo",
        per_device_train_batch_size=4,
        num_generations=4, max_completion_length=256, max_tool_calling_iterations=5, max_steps=3, learning_rate=1e-5,
        logging_steps=1, report_to="none", save_strategy="no",
    )
    suite_args, shaping_args, training_args, model_args = parser.parse_args_and_config()
    suite = suite_args.load_suite()

    trainer = ThunderSyncGRPOTrainer(
        model=resolve_model(model_args.model_name_or_path, suite_args.tiny_model_dir, training_args),
        reward_funcs=length_shaping(shaping_args.length_penalty, training_args),
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
