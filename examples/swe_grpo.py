"""GRPO on SWE-style repair tasks with tools in a sandbox, streamed with ThunderSync.

Out of the box (CPU, offline): the tiny model warm-started to call tools (`tiny-agent`, built on first use),
the bundled Python repair tasks, bubblewrap-sandboxed shell tools and the embedded rollout server (started for the run):

    accelerate launch examples/swe_grpo.py
    python examples/swe_grpo.py --max_steps 2 --schedule sync

A real run: `--model_name_or_path Qwen/Qwen3-8B` (or a local folder), `--use_peft --lora_r 16` for LoRA, and your
own SWE-smith / SWE-bench rows with local checkouts: `--swe_rows data.jsonl --swe_repo_root /path/to/repos`.
vLLM: start `vllm serve` (see README, "Rollout servers") and add `--use_vllm --vllm_mode server
--vllm_server_base_url http://HOST:8000` (or `--vllm_server_base_urls URL1 URL2` for several replicas).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.scripts import finish_distributed, resolve_model, set_script_defaults


@dataclass
class SWEArguments(ScriptArguments):
    tiny_model_dir: str = field(default="tiny-agent", metadata={"help": "Where the offline tiny model is created."})
    swe_rows: str | None = field(default=None, metadata={"help": "SWE-smith / SWE-bench style JSON or JSONL rows."})
    swe_repo_root: str | None = field(default=None, metadata={"help": "Local checkouts for --swe_rows."})
    num_tasks: int | None = field(default=None, metadata={"help": "Use only the first N tasks."})
    length_penalty: float = field(
        default=0.001, metadata={"help": "Weight of a small per-token penalty that shapes the reward (0 disables)."}
    )


def shorter_is_better(completion_ids, **kwargs) -> list[float]:
    """Minus the completion length: a dense shaping term next to the environment's pass/fail reward."""
    return [-float(len(ids)) for ids in completion_ids]


def main() -> None:
    parser = TrlParser((SWEArguments, ThunderSyncGRPOConfig, ModelConfig))
    set_script_defaults(
        parser, model_name_or_path="tiny-agent",
        output_dir="outputs/swe_grpo", per_device_train_batch_size=4, num_generations=4,
        max_completion_length=256, max_tool_calling_iterations=5, max_steps=3, learning_rate=1e-5,
        logging_steps=1, report_to="none", save_strategy="no",
    )
    script_args, training_args, model_args = parser.parse_args_and_config()

    from trl_thundersync.envs.swe import SWERepairEnv
    from trl_thundersync.envs.tasks import load_swe_rows, load_swe_suite, swe_dataset

    if script_args.swe_rows:
        tasks = load_swe_rows(script_args.swe_rows, script_args.swe_repo_root)
    else:
        tasks = load_swe_suite()
    if script_args.num_tasks:
        tasks = dict(list(tasks.items())[: script_args.num_tasks])

    reward_funcs, weights = [], []
    if script_args.length_penalty:
        reward_funcs, weights = [shorter_is_better], [script_args.length_penalty]
    if training_args.reward_weights is None and weights:
        training_args.reward_weights = weights  # TRL appends the environment's get_reward with weight 1

    trainer = ThunderSyncGRPOTrainer(
        model=resolve_model(model_args.model_name_or_path, script_args.tiny_model_dir),
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=swe_dataset(tasks),
        peft_config=get_peft_config(model_args),
        environment_factory=lambda: SWERepairEnv(tasks),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    print(f"done: {trainer.state.global_step} optimizer steps on {len(tasks)} tasks; "
          f"policy version {trainer.policy_version}")
    finish_distributed()


if __name__ == "__main__":
    main()
