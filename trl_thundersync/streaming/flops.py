"""Learner FLOPs of one source, per the paper's Appendix B operator accounting (2·m·k·n per matrix product).

For a decoder-only transformer processing a context of L tokens (all of them count, also loss-masked ones):

    forward  = Σ_layers [ 2·L·d·(q + k + v + o widths) + 2·2·L²·(heads·head_dim) + 2·L·d·ff·(3 if gated else 2) ]
               + 2·L·d·V                                                       (vocabulary projection)
    backward = input-gradient products (1× forward) + weight-gradient products (1× forward, trainable weights only)

Full fine-tuning: 3× forward. LoRA: the frozen base keeps its input-gradient product only (2× forward) and the
adapters add their own forward + backward (3 · 2·L·r·(d_in + d_out) per adapted matrix). Attention scores count the
full L×L product ("padding that reaches a kernel counts as executed work"); recomputation from activation
checkpointing is not credited. An estimate from the config's shapes, not a kernel profile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import torch

FlopCounter = Callable[[int], float]  # tokens of one source's context → FLOPs of its forward + backward


@dataclass(frozen=True)
class ModelShape:
    """The shapes the FLOP ledger needs, read from a transformers config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    gated_mlp: bool = True

    @classmethod
    def from_config(cls, config) -> ModelShape:
        config = getattr(config, "text_config", config)
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            layers=config.num_hidden_layers, hidden=config.hidden_size, heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", heads) or heads, head_dim=head_dim,
            intermediate=config.intermediate_size, vocab=config.vocab_size,
            gated_mlp=getattr(config, "hidden_act", "silu") in ("silu", "swiglu", "gelu_pytorch_tanh") or True,
        )


def forward_flops(shape: ModelShape, tokens: int) -> float:
    """FLOPs of one forward pass over a context of `tokens` tokens."""
    L, d = tokens, shape.hidden
    q_out, kv_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    projections = 2 * L * d * (q_out + 2 * kv_out) + 2 * L * q_out * d
    attention = 2 * 2 * L * L * q_out  # QK^T and AV
    mlp = 2 * L * d * shape.intermediate * (3 if shape.gated_mlp else 2)
    return float(shape.layers * (projections + attention + mlp) + 2 * L * d * shape.vocab)


def learner_flops(shape: ModelShape, tokens: int, lora_adapter_params: int | None = None) -> float:
    """FLOPs of one source's forward + backward (full fine-tuning, or LoRA with `lora_adapter_params` weights)."""
    forward = forward_flops(shape, tokens)
    if lora_adapter_params is None:
        return 3.0 * forward
    return 2.0 * forward + 3.0 * 2.0 * tokens * lora_adapter_params


def flop_counter(config, lora_adapter_params: int | None = None) -> FlopCounter | None:
    """`learner_flops` bound to a model's shapes, or None for a config that is not a standard decoder's (no estimate
    rather than a wrong one)."""
    try:
        shape = ModelShape.from_config(config)
    except AttributeError:
        return None
    return partial(learner_flops, shape, lora_adapter_params=lora_adapter_params)


def model_flop_counter(model: torch.nn.Module, trainable: Iterable[torch.nn.Parameter]) -> FlopCounter | None:
    """The `flop_counter` of an (unwrapped) policy: its config's shapes; with a PEFT adapter, the `trainable`
    parameters are the adapter's (LoRA accounting)."""
    adapter = sum(p.numel() for p in trainable) if hasattr(model, "peft_config") else None
    return flop_counter(getattr(model, "config", None), adapter)
