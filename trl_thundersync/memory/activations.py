"""The activations of one learner pass, from the model's config: what autograd saves for the backward.

A decoder layer of the Qwen/Llama family saves, per token, about 6·h + 4·(q + kv + i) elements, where h is the
hidden size, q = heads·head_dim, kv = key-value heads·head_dim and i the MLP's intermediate size (the norms' inputs
and outputs, the projections' inputs, the rotary embeddings, the attention output, the MLP's gate, up and their
product); the embedding and the final norm add about 3·h per token. The coefficients were fitted to the bytes
`torch.autograd.graph.saved_tensors_hooks` reports for Qwen3 models (SDPA attention, which saves no s² scores) and
are checked against it in `tests/unit/memory/test_activations.py` (within 10%). The loss adds the logits of the
scored tokens: the logits, their log-softmax and, as the backward starts, their gradient (3·T·V in FP32).

With gradient checkpointing a layer keeps only its input (h per token) and one layer's activations are live again
in the backward. Mixture-of-experts layers and eager attention (s² scores) are not modelled; the trainer logs the
measured peak beside the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LAYER_HIDDEN = 6.1  # saved elements per token per layer, per unit of hidden size...
LAYER_PROJECTIONS = 4.0  # ...and per unit of the q, kv and MLP widths
OUTSIDE_LAYERS = 3.3  # the embedding and the final norm, per unit of hidden size
LOGIT_COPIES = 3  # logits, log-softmax, their gradient


@dataclass(frozen=True)
class ModelShape:
    """What the activation estimate reads from a model config."""

    hidden: int
    layers: int
    intermediate: int
    query_width: int  # heads · head_dim
    kv_width: int  # key-value heads · head_dim
    vocab: int

    @classmethod
    def from_config(cls, config: Any) -> ModelShape | None:
        """The shape of a Hugging Face decoder config; None when it lacks a field (the plan then has no line)."""
        config = getattr(config, "text_config", None) or config
        try:
            hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
            head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
            kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
            return cls(hidden=hidden, layers=int(config.num_hidden_layers), intermediate=int(config.intermediate_size),
                       query_width=heads * head_dim, kv_width=kv_heads * head_dim, vocab=int(config.vocab_size))
        except (AttributeError, TypeError, ValueError):
            return None

    def per_token_elements(self, checkpointed: bool = False) -> float:
        """Saved elements per forwarded token, every layer and the embedding included (logits apart). With gradient
        checkpointing each layer keeps only its input (h) and one layer's activations live again in the backward."""
        layer = LAYER_HIDDEN * self.hidden + LAYER_PROJECTIONS * (self.query_width + self.kv_width + self.intermediate)
        if checkpointed:
            return self.layers * self.hidden + layer + OUTSIDE_LAYERS * self.hidden
        return self.layers * layer + OUTSIDE_LAYERS * self.hidden


def pass_activation_bytes(shape: ModelShape | None, tokens: int, scored_tokens: int, dtype_bytes: int,
                          checkpointed: bool = False) -> int:
    """Bytes one pass of `tokens` forwarded tokens holds for its backward, `scored_tokens` of them with logits in
    the loss (FP32 logits, `LOGIT_COPIES` of them); 0 without a shape."""
    if shape is None or tokens <= 0:
        return 0
    saved = shape.per_token_elements(checkpointed) * tokens * dtype_bytes
    return int(saved + LOGIT_COPIES * scored_tokens * shape.vocab * 4)


@dataclass(frozen=True)
class PassPlan:
    """The activations planned for a run's largest passes, and its shared prefix."""

    streamed_bytes: int  # sync / thundersync: the largest learner pass
    trl_bytes: int  # stock TRL: one micro-batch
    tokens: int  # forwarded tokens of the largest learner pass
    prefix_bytes: int = 0  # one open group's shared prefix (0: none)


def plan_passes(shape: ModelShape | None, *, prompt_tokens: int, completion_tokens: int, num_generations: int,
                group_passes: bool, max_pass_tokens: int, trl_rows: int, dtype_bytes: int,
                checkpointed: bool = False, shared_prefix_from: int | None = None) -> PassPlan:
    """A learner pass forwards one member (prompt + completion), or, with group passes, as many members of a group
    as fit `max_pass_tokens` (`batch_group_max_tokens`; at least one); a stock-TRL pass forwards `trl_rows` rows
    (`per_device_train_batch_size`) of the same length. `shared_prefix_from`: the shared prefix's minimum prompt
    (`shared_prefix_min_prompt_tokens`; None: off); a prompt that long is forwarded once per group (`prefix_bytes`)
    and a member's pass forwards its completion only, where TRL still forwards the prompt with every member."""
    shared = shared_prefix_from is not None and prompt_tokens >= shared_prefix_from
    member_prompt = 0 if shared else prompt_tokens

    def rows_and_length(prompt: int) -> tuple[int, int]:
        length = max(prompt + completion_tokens, 1)
        return (max(1, min(num_generations, max_pass_tokens // length)) if group_passes else 1), length

    rows, length = rows_and_length(member_prompt)
    streamed = pass_activation_bytes(shape, rows * length, rows * completion_tokens, dtype_bytes, checkpointed)
    trl_length = max(prompt_tokens + completion_tokens, 1)
    trl = pass_activation_bytes(shape, trl_rows * trl_length, trl_rows * completion_tokens, dtype_bytes,
                                checkpointed)
    prefix = prefix_bytes(shape, prompt_tokens, dtype_bytes, checkpointed) if shared else 0
    return PassPlan(streamed, trl, rows * length if shape is not None else 0, prefix)


def prefix_bytes(shape: ModelShape | None, prompt_tokens: int, dtype_bytes: int, checkpointed: bool = False,
                 channels: int = 2) -> int:
    """One open group's shared prefix (`streaming/shared_prefix.py`): the prompt's forward graph (its saved
    activations, no logits) and the FP32 adjoints of its key/value states, one set per channel (GRPO: the
    reward-weighted and the plain sum); 0 without a shape."""
    if shape is None or prompt_tokens <= 0:
        return 0
    adjoints = channels * 2 * shape.kv_width * shape.layers * prompt_tokens * 4
    return pass_activation_bytes(shape, prompt_tokens, 0, dtype_bytes, checkpointed) + adjoints
