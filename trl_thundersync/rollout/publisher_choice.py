"""Which `WeightPublisher` a run uses: `vllm_weight_publisher`'s values, and what "auto" stands for.

    auto, embedded servers                    -> "http"    (they load a safetensors file; they report a version)
    auto, vLLM servers, vllm_publish_dir set  -> "reload"  (a folder the servers read: checkpoints, not NCCL)
    auto, vLLM servers, CUDA + TRL's client   -> "nccl"    (TRL's NCCL weight transfer; needs vLLM installed here)
    auto, vLLM servers, otherwise             -> "reload"  (CPU, or no vLLM in the trainer's environment)

The choice and its reason are logged once per engine (a warning for vLLM servers, so that it shows). A value that
cannot work with the servers found is refused at engine start, naming the field and the alternatives: "http" with
vLLM servers (they have no `/thundersync/update_weights`), "reload" with embedded servers (no `/collective_rpc`),
"nccl" on a device that is not CUDA (TRL's client refuses it).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import ConfigurationError
from .vllm_publish import HTTPWeightFile, LoRAAdapterPublisher, TRLNCCLPublisher, WeightPublisher
from .vllm_reload import CheckpointReloadPublisher

__all__ = ["PUBLISHERS", "auto_publisher", "build_publisher", "make_publisher", "nccl_unusable"]

logger = logging.getLogger(__name__)

PUBLISHERS = ("http", "lora", "nccl", "reload")  # the concrete values of `vllm_weight_publisher`


def nccl_unusable(device: Any) -> str | None:
    """Why TRL's NCCL weight transfer cannot work from `device` in this environment, or None when it can."""
    try:
        kind = torch.device(device if device is not None else "cpu").type
    except (RuntimeError, TypeError):
        return f"device {device!r} is not a torch device"
    if kind != "cuda":
        return f"the learner's device is {kind}, and NCCL needs CUDA"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in the trainer's environment (TRL's NCCL client needs it)"
    if importlib.util.find_spec("trl.generation.vllm_client") is None:
        return "this TRL has no trl.generation.vllm_client"
    return None


def auto_publisher(*, vllm: bool, device: Any, directory: bool) -> tuple[str, str]:
    """`(publisher, reason)` for `vllm_weight_publisher='auto'`: `vllm` — the servers are vLLM (else embedded);
    `device` — the learner's; `directory` — `vllm_publish_dir` is set."""
    if not vllm:
        return "http", "embedded servers load a weights file"
    if directory:
        return "reload", "vllm_publish_dir is set: the servers read checkpoints from it"
    why_not = nccl_unusable(device)
    if why_not is None:
        return "nccl", "the learner is on CUDA and TRL's NCCL client is installed"
    return "reload", f"NCCL cannot work here ({why_not})"


def build_publisher(name: str, *, directory: str | None = None, timeout: float = 600.0,
                    nccl_options: Mapping[str, Any] | None = None) -> WeightPublisher:
    """The publisher named `name` (one of `PUBLISHERS`), writing into `directory` where it writes files."""
    if name == "nccl":
        return TRLNCCLPublisher(timeout=timeout, **(nccl_options or {}))
    factories = {"http": HTTPWeightFile, "lora": LoRAAdapterPublisher, "reload": CheckpointReloadPublisher}
    if name not in factories:
        raise ConfigurationError(f"publisher={name!r} is not one of {['auto', *PUBLISHERS]} or a WeightPublisher")
    return factories[name](directory, timeout=timeout)


def make_publisher(spec: WeightPublisher | str, reported: Sequence[int | None],
                   nccl_options: Mapping[str, Any] | None = None) -> WeightPublisher:
    """The engine's publisher for servers that reported `reported` at start (an embedded server reports its policy
    version, vLLM None). `nccl_options` are `TRLNCCLPublisher`'s keyword arguments (device, dtype, group_port, ...);
    their `device` (the learner's) also decides 'auto'."""
    if not isinstance(spec, str):
        return spec
    embedded = [v is not None for v in reported]
    if any(embedded) and not all(embedded):
        raise ConfigurationError(f"publisher={spec!r} cannot mix embedded servers and vLLM servers: give one kind "
                                 "per run")
    vllm = not any(embedded)
    device = (nccl_options or {}).get("device")
    if spec == "auto":
        spec, reason = auto_publisher(vllm=vllm, device=device, directory=False)
        # vLLM servers: said where a user sees it (one line per engine), since the choice decides what the servers
        # must allow (NCCL ports, or a folder they read and dev-mode /collective_rpc)
        logger.log(logging.WARNING if vllm else logging.INFO, "vllm_weight_publisher='auto' chose %r: %s", spec, reason)
    elif spec == "http" and vllm:
        raise ConfigurationError(
            "vllm_weight_publisher='http' loads full weights through the embedded server's "
            "/thundersync/update_weights, which vLLM servers do not have; for vLLM use 'reload' (a checkpoint "
            "folder loaded through dev-mode /collective_rpc, CPU or GPU), 'nccl' (GPU) or 'lora' (adapters)")
    elif spec == "reload" and not vllm:
        raise ConfigurationError("vllm_weight_publisher='reload' loads checkpoints through vLLM's /collective_rpc, "
                                 "which embedded servers do not have; use 'http' (or 'auto') for them")
    if spec == "nccl":
        return TRLNCCLPublisher(**(nccl_options or {}))
    return build_publisher(spec)
