"""Shared fixtures: one tiny offline model folder per session, CPU-only configs, deterministic rollouts."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from trl_thundersync.testing.tiny import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def load_model(path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def scripted_rollout_func(tokenizer, max_len=8, vocab_low=10, with_eos=0.5):
    """A TRL `rollout_func` returning deterministic pseudo-random completions (same for every trainer).

    Completion content depends on (prompt text, occurrence within the batch, global step), so two trainers fed the
    same batches see identical rollouts. Some completions end in EOS, others are truncated.
    """

    def rollout_func(prompts, trainer):
        step = trainer.state.global_step
        seen: dict[str, int] = {}
        prompt_ids, completion_ids = [], []
        for prompt in prompts:
            text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
            k = seen.get(text, 0)
            seen[text] = k + 1
            digest = hashlib.sha256(f"{text}|{k}|{step}".encode()).digest()
            length = 2 + digest[0] % (max_len - 1)
            ids = [vocab_low + digest[1 + j] % (len(tokenizer) - vocab_low - 1) for j in range(length)]
            if digest[-1] / 255 < with_eos:
                ids[-1] = tokenizer.eos_token_id
            prompt_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
            completion_ids.append(ids)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": [[0.0] * len(c) for c in completion_ids]}

    return rollout_func


def reward_len(completion_ids, **kwargs):
    return [float(len(c)) for c in completion_ids]


def reward_parity(completion_ids, **kwargs):
    """Returns None (not applicable) on some rows, like a task-specific reward."""
    return [None if c[0] % 3 == 0 else float(sum(c) % 7) - 3.0 for c in completion_ids]


def prompt_dataset(n=8):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"Question {i}: what is {i} + {i}?" for i in range(n)]})


def cpu_config(cls, tmp_path, **overrides):
    base = dict(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", logging_steps=1,
        per_device_train_batch_size=4, num_generations=2, max_completion_length=8, max_steps=3,
        learning_rate=1e-2, save_strategy="no", seed=0, gradient_checkpointing=False, disable_tqdm=True,
    )
    base.update(overrides)
    return cls(**base)
