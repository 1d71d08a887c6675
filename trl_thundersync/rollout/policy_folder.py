"""A policy saved as a model folder a server can load: config, FP32 weights, generation config, tokenizer.

Both server kinds start from such a folder: the embedded server (`serve.launcher`) and a managed `vllm serve`
(`rollout.vllm_managed`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .weights import base_config, policy_state_dict, unwrap_model


def write_policy_folder(model: Any, tokenizer: Any, directory: Path, *, without_adapters: bool = False) -> Path:
    """Save what a server needs to serve `model` as it is now: config, FP32 weights, generation config, tokenizer.

    `without_adapters`: for a PEFT policy, the base weights alone (LoRA disabled) — what a server that will receive
    the adapter through `/v1/load_lora_adapter` must hold; otherwise the LoRA delta is merged in.
    """
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    base_config(model).save_pretrained(directory)
    inner = unwrap_model(model)
    if without_adapters and hasattr(inner, "disable_adapter"):
        with inner.disable_adapter():
            state = policy_state_dict(inner)
    else:
        state = policy_state_dict(inner)
    save_file(state, str(directory / "model.safetensors"))
    inner = unwrap_model(model)
    generation_config = getattr(inner, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory
