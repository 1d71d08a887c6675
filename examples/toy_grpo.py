"""Train a tiny model with ThunderSyncGRPOTrainer on CPU — a TRL-style GRPO script with the two names swapped.

    python examples/toy_grpo.py --config configs/toy_grpo.yaml
    accelerate launch --num_processes 1 --cpu examples/toy_grpo.py --config configs/toy_grpo.yaml

With `--model_name_or_path tiny` (the default) a random-weight Qwen3-style model and tokenizer are created offline
under `--tiny_model_dir`; pass a hub id or local folder to train a real model. The data set is built-in (arithmetic
questions) unless `--dataset_name` names a Hugging Face data set with a `prompt` column. The run ends with a summary
of its steps, rewards and timings, and where its trace and timeline were written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from datasets import Dataset, load_dataset
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.examples_support.plumbing import finish_distributed, resolve_model, set_script_defaults
from trl_thundersync.examples_support.reports import report_run


@dataclass
class ToyArguments(ScriptArguments):
    dataset_name: str | None = field(default=None, metadata={"help": "Data set with a `prompt` column (optional)."})
    tiny_model_dir: str = field(default="tiny-qwen3", metadata={"help": "Where the offline tiny model is created."})
    num_prompts: int = field(default=64, metadata={"help": "Size of the built-in arithmetic data set."})


def arithmetic_dataset(n: int) -> Dataset:
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with a number."}], "answer": a + b}
            for a, b in ((i % 10, (3 * i) % 10) for i in range(n))]
    return Dataset.from_list(rows)


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def correct_answer(completions, answer, **kwargs) -> list[float]:
    """1.0 if the first number in the completion is the right sum, else 0.0."""
    out = []
    for completion, expected in zip(completions, answer, strict=True):
        match = re.search(r"-?\d+", _text(completion) or "")
        out.append(float(match is not None and int(match.group()) == expected))
    return out


def short_and_digit_rich(completions, **kwargs) -> list[float]:
    """A dense shaping reward so the tiny random model gets a signal: digits help, length hurts."""
    out = []
    for completion in completions:
        text = _text(completion) or ""
        out.append(sum(c.isdigit() for c in text) / 4.0 - len(text) / 64.0)
    return out


def main() -> None:
    parser = TrlParser((ToyArguments, ThunderSyncGRPOConfig, ModelConfig))
    set_script_defaults(parser, output_dir="outputs/toy_grpo", per_device_train_batch_size=8, num_generations=4,
                        max_completion_length=24, max_steps=6, learning_rate=1e-4, logging_steps=1,
                        report_to="none", save_strategy="no")
    script_args, training_args, model_args = parser.parse_args_and_config()
    model_name = resolve_model(model_args.model_name_or_path, script_args.tiny_model_dir, training_args)
    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(torch, model_args.dtype)
    training_args.model_init_kwargs = {**(training_args.model_init_kwargs or {}), "dtype": dtype or "auto"}

    if script_args.dataset_name:
        dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config,
                               split=script_args.dataset_train_split)
        reward_funcs = [short_and_digit_rich]
    else:
        dataset = arithmetic_dataset(script_args.num_prompts)
        reward_funcs = [correct_answer, short_and_digit_rich]

    trainer = ThunderSyncGRPOTrainer(
        model=model_name,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    totals, timing = trainer.last_batch
    print(
        f"done: {trainer.state.global_step} optimizer steps, policy version {trainer.policy_version}; last batch "
        f"{timing.barrier - timing.start:.2f}s wall, learner tail {timing.tail:.2f}s, "
        f"stats peak {totals.peak_stats_bytes / 2**20:.2f} MiB"
    )
    report_run(trainer)
    finish_distributed()


if __name__ == "__main__":
    main()
