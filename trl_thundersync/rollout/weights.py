"""Generation-ready weights of a policy, under plain Hugging Face names, without touching the policy.

A rollout engine holds a plain `transformers` model (`AutoModelForCausalLM.from_config(base_config(policy))`) and
needs the weights the *policy's forward* uses. For a plain `PreTrainedModel` that is its state dict. For a
`peft.PeftModel` with LoRA it is, per adapted layer, `W + ΔW` with `ΔW = layer.get_delta_weight(adapter)`
(`B @ A * scaling`, transposed for `fan_in_fan_out`), summed over the active adapters, with PEFT's name prefixes
(`base_model.model.`, `.base_layer`) removed and the `lora_*` tensors dropped.

The merge is computed out of place: `merge_adapter()` / `unmerge_adapter()` would round-trip the base weights through
`W + ΔW - ΔW`, which is not bit-exact, and would silently drift the learner's θ at every publication.

    state = policy_state_dict(model)          # {name: detached CPU float32 clone}
    for name, tensor in policy_tensors(model): ...   # the same weights, streamed in the model's dtype and device
    replica = AutoModelForCausalLM.from_config(base_config(model)); replica.load_state_dict(state)

`FlatLayout` moves such a state dict between processes as one flat FP32 buffer (allocated once, in shared memory
for a spawned worker, rewritten in place at each publication) instead of one pickled tensor per name.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import RolloutError, UnsupportedOptionError


def unwrap_model(model: Any) -> nn.Module:
    """Strip accelerate / DDP / DeepSpeed wrappers (`.module`) until the policy itself is reached."""
    while isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module policy, got {type(model).__name__}")
    return model


def is_peft_model(model: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # peft is a dependency, but a plain model must not need it
        return False
    return isinstance(model, PeftModel)


def _transformers_model(model: nn.Module) -> nn.Module:
    """The underlying `transformers` model: the policy itself, or the model inside a PeftModel (LoRA layers in it)."""
    return model.get_base_model() if is_peft_model(model) else model


def base_config(model: Any) -> Any:
    """The `transformers` config of the policy (of its base model for a PeftModel)."""
    inner = _transformers_model(unwrap_model(model))
    config = getattr(inner, "config", None)
    if config is None:
        raise TypeError(f"{type(inner).__name__} has no `.config`: not a transformers model")
    return config


def _fp32_clone(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    dtype = torch.float32 if tensor.is_floating_point() else tensor.dtype
    return tensor.to(device="cpu", dtype=dtype, copy=True)


def policy_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Full weights the policy generates with, as `{plain HF name: detached CPU clone}` (floating tensors in FP32).

    Never mutates `model`. Raises `UnsupportedOptionError` for PEFT methods other than vanilla LoRA (DoRA and other
    variants, prompt learning, trainable-token wrappers), which cannot be expressed as `W + ΔW` here.
    """
    model = unwrap_model(model)
    if not is_peft_model(model):
        return {name: _fp32_clone(t) for name, t in model.state_dict().items()}
    return {name: _fp32_clone(t) for name, t in _merged_lora_tensors(model, merged_dtype=torch.float32)}


def tied_output_embedding(model: Any) -> tuple[str, str] | None:
    """`(output embedding weight name, input embedding weight name)` when the policy ties them (its config's
    `tie_word_embeddings`, or one shared tensor), else None. A checkpoint that stores only the input embedding
    relies on the loader to tie them again; vLLM's in-place reload does not (its `lm_head` then stays stale)."""
    inner = _transformers_model(unwrap_model(model))
    try:
        output, embed = inner.get_output_embeddings(), inner.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if output is None or embed is None:
        return None
    shared = getattr(output, "weight", None) is getattr(embed, "weight", object())
    if not (shared or getattr(getattr(inner, "config", None), "tie_word_embeddings", False)):
        return None
    names = {id(module): name for name, module in inner.named_modules(remove_duplicate=False)}
    if id(output) not in names or id(embed) not in names:
        return None
    return f"{names[id(output)]}.weight", f"{names[id(embed)]}.weight"


def policy_tensors(model: Any, *, specs: bool = False) -> Iterator[tuple[Any, ...]]:
    """The same weights as `policy_state_dict`, streamed in the model's own dtype from its own device (what a GPU
    broadcast to vLLM sends): `(name, tensor)`, one at a time. A plain model's tensors are its own parameters
    (detached, no copy); a LoRA layer's `W + ΔW` is computed when its turn comes, in FP32, and cast to W's dtype,
    so at most one merged layer exists at a time besides the model. `specs=True`: `(name, dtype, shape)` of what
    would be streamed, without computing anything (the metadata announced before the broadcast).
    """
    model = unwrap_model(model)
    if not is_peft_model(model):
        named = list(model.named_parameters())
        if specs:
            return iter([(name, p.dtype, tuple(p.shape)) for name, p in named])
        return ((name, p.detach()) for name, p in named)
    if specs:
        return iter(_lora_specs(model))
    return _merged_lora_tensors(model, merged_dtype=None)


def _lora_plan(peft_model: nn.Module) -> tuple[dict[str, tuple[str, Any]], dict[str, Any]]:
    """Before anything is computed: `{state key: (plain name, LoRA layer or None)}` for every tensor to stream, in
    state-dict order, and the LoRA layers by key prefix. Refuses what cannot be merged (see policy_state_dict)."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper, ModulesToSaveWrapper

    for name, cfg in peft_model.peft_config.items():
        if getattr(cfg, "is_prompt_learning", False) or cfg.peft_type != "LORA":
            raise UnsupportedOptionError(
                f"adapter {name!r} is {cfg.peft_type}; only LoRA adapters can be merged into rollout weights"
            )
    inner = peft_model.get_base_model()
    layers: dict[str, Any] = {}  # plain key prefix of a LoRA layer ("model.layers.0.q_proj.") -> the layer
    dropped: set[str] = set()  # key prefixes of inactive module copies
    renamed: dict[str, str] = {}  # key prefix of the active ModulesToSaveWrapper copy -> the wrapper's own prefix
    for mod_name, module in inner.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        if isinstance(module, LoraLayer):
            _check_mergeable(module, prefix)
            layers[prefix] = module
        elif isinstance(module, ModulesToSaveWrapper):
            active = None if module.disable_adapters else module.active_adapter
            if isinstance(active, list):
                active = active[0] if active else None
            if active is not None and active in module.modules_to_save:
                renamed[f"{prefix}modules_to_save.{active}."] = prefix
                dropped.add(f"{prefix}original_module.")
            else:
                renamed[f"{prefix}original_module."] = prefix
            dropped.add(f"{prefix}modules_to_save.")
        elif isinstance(module, (AuxiliaryTrainingWrapper, BaseTunerLayer)):
            raise UnsupportedOptionError(
                f"module {mod_name!r} is a {type(module).__name__}; only LoRA layers and modules_to_save are "
                "supported when building rollout weights"
            )
    plan: dict[str, tuple[str, Any]] = {}
    for key in inner.state_dict():
        plain = _plain_name(key, renamed, dropped)
        if plain is not None:
            owner = plain.rsplit(".", 1)[0] + "." if "." in plain else ""
            plan[key] = (plain, layers.get(owner) if plain.endswith((".weight", ".bias")) else None)
    plain_names = {plain for plain, _ in plan.values()}
    missing = sorted(f"{p}weight" for p in layers if f"{p}weight" not in plain_names)
    if missing:
        raise UnsupportedOptionError(f"merged LoRA weights {missing[:3]} have no matching base-model tensor")
    return plan, layers


def _lora_specs(peft_model: nn.Module) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    state = peft_model.get_base_model().state_dict()
    plan, _ = _lora_plan(peft_model)
    return [(plain, state[key].dtype, tuple(state[key].shape)) for key, (plain, _) in plan.items()]


def _merged_lora_tensors(peft_model: nn.Module, *, merged_dtype: torch.dtype | None
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """`(plain name, tensor)` in state-dict order: W + ΔW for LoRA layers (computed per layer when reached, in FP32,
    then cast to `merged_dtype` or W's own dtype), the other tensors as they are (detached references)."""
    state = peft_model.get_base_model().state_dict()
    plan, _ = _lora_plan(peft_model)
    pending: dict[str, torch.Tensor] = {}  # merged tensors of the current layer not yet yielded
    current: Any = None
    with torch.no_grad():
        for key, (plain, layer) in plan.items():
            tensor = state[key].detach()
            if layer is not None:
                if layer is not current:
                    current, pending = layer, _merged_layer(layer, plain.rsplit(".", 1)[0] + ".")
                merged = pending.pop(plain, None)
                if merged is not None:
                    tensor = merged.to(merged_dtype or tensor.dtype)
            yield plain, tensor


def _check_mergeable(layer: Any, prefix: str) -> None:
    if layer.lora_variant:
        raise UnsupportedOptionError(
            f"LoRA layer {prefix[:-1]!r} uses a LoRA variant ("
            + ", ".join(f"{a}: {type(v).__name__}" for a, v in sorted(layer.lora_variant.items()))
            + "), e.g. DoRA; only vanilla LoRA can be merged without mutating the policy"
        )
    if layer.merged and layer.disable_adapters:
        raise UnsupportedOptionError(
            f"LoRA layer {prefix[:-1]!r} has merged adapters but adapters are disabled; unmerge them first"
        )


def _plain_name(key: str, renamed: dict[str, str], dropped: set[str]) -> str | None:
    """Map a PEFT state-dict key to its plain HF name, or None for adapter tensors and inactive copies."""
    for old, new in renamed.items():
        if key.startswith(old):
            key = new + key[len(old) :]
            break
    else:
        if any(key.startswith(p) for p in dropped):
            return None
    parts = key.split(".")
    if any(p.startswith("lora_") for p in parts):
        return None
    return ".".join(p for p in parts if p != "base_layer")


def _merged_layer(layer: Any, prefix: str) -> dict[str, torch.Tensor]:
    """`{prefix+'weight': W + Σ ΔW_a}` (and the bias with LoRA biases) for one LoRA layer, computed out of place.

    Mirrors the layer's forward: disabled adapters contribute nothing, an already-merged layer is used as it is.
    """
    _check_mergeable(layer, prefix)
    if layer.merged or layer.disable_adapters:
        return {}
    base = layer.get_base_layer()
    adapters = [a for a in layer.active_adapters if a in layer.lora_A or a in getattr(layer, "lora_embedding_A", {})]
    if not adapters:
        return {}
    weight = base.weight.detach().to(torch.float32, copy=True)
    bias = None
    for adapter in adapters:
        weight += layer.get_delta_weight(adapter).to(torch.float32)
        if getattr(layer, "lora_bias", {}).get(adapter, False):
            if bias is None:
                bias = base.bias.detach().to(torch.float32, copy=True)
            bias += layer.lora_B[adapter].bias.detach().float() * layer.scaling[adapter]
    out = {f"{prefix}weight": weight}
    if bias is not None:
        out[f"{prefix}bias"] = bias
    return out


@dataclass(frozen=True)
class FlatLayout:
    """Where each floating tensor of a state dict lives in a flat FP32 buffer of `numel` elements."""

    entries: tuple[tuple[str, int, tuple[int, ...]], ...]  # (name, offset, shape), in state-dict order
    numel: int  # total elements of the buffer

    @staticmethod
    def of(state: dict[str, torch.Tensor]) -> FlatLayout:
        entries, offset = [], 0
        for name, t in state.items():
            if t.is_floating_point():
                entries.append((name, offset, tuple(t.shape)))
                offset += t.numel()
        return FlatLayout(tuple(entries), offset)

    def pack(self, state: dict[str, torch.Tensor], buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """Copy the floating tensors of `state` into `buf` [numel]; return the non-floating ones (sent as they are).

        Raises `RolloutError` if `state` does not have exactly this layout's names and shapes.
        """
        floats = {n: t for n, t in state.items() if t.is_floating_point()}
        expected = {name: shape for name, _, shape in self.entries}
        if {n: tuple(t.shape) for n, t in floats.items()} != expected:
            diff = sorted(set(floats) ^ set(expected)) or [n for n in floats if tuple(floats[n].shape) != expected[n]]
            raise RolloutError(f"state dict does not match the engine's model (first differences: {diff[:3]})")
        for name, offset, _ in self.entries:
            buf[offset : offset + floats[name].numel()].copy_(floats[name].reshape(-1))
        return {n: t for n, t in state.items() if not t.is_floating_point()}

    def views(self, buf: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """`(name, tensor)` for every entry, as views into `buf` (no copy)."""
        for name, offset, shape in self.entries:
            yield name, buf[offset : offset + math.prod(shape)].view(shape)
