"""`rollout_engine='auto'` and 'managed_vllm' (trainers/rollout_choice.py, trainers/rollout_setup.py) without a real
server: which engine a config and a model settle on, why, and what the managed engine is built with. The real
`vllm serve` runs in tests/real_vllm/test_managed.py."""

from __future__ import annotations

import dataclasses
import json
import logging
from types import SimpleNamespace

import pytest
import torch

from benchmarks.parity import cpu_config
from tests.fixtures.fake_vllm import fake_vllm_install
from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGRPOConfig
from trl_thundersync.errors import ConfigurationError, UnsupportedOptionError

SERVABLE = SimpleNamespace(head_dim=32, hidden_size=64, num_attention_heads=2)  # a CPU vLLM's head sizes include 32
UNSERVABLE = SimpleNamespace(head_dim=16, hidden_size=64, num_attention_heads=4)


@pytest.fixture
def install(tmp_path):
    return fake_vllm_install(tmp_path)


def test_auto_picks_managed_vllm_where_an_installation_can_serve_the_model(tmp_path, install, caplog):
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, rollout_vllm=str(install.python))
    with caplog.at_level(logging.WARNING):
        choice = config.settle_rollout_engine(SERVABLE)
    assert choice.engine == "managed_vllm" and choice.install.python == install.python
    assert config.resolved_rollout_engine() == "managed_vllm" and config.samples_from_vllm()
    assert "rollout_engine='auto' chose 'managed_vllm'" in caplog.text and "CPU build" in caplog.text
    assert "_rollout_choice" not in json.loads(config.to_json_string())  # a decision, not a setting: not saved


def test_auto_falls_back_to_the_embedded_server_and_says_why(tmp_path, install):
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path)  # tests/conftest.py: no automatic search
    choice = config.settle_rollout_engine(SERVABLE)
    assert choice.engine == "embedded_server" and "no vLLM installation was found" in choice.reason
    assert not config.samples_from_vllm()
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, rollout_vllm=str(install.python))
    choice = config.settle_rollout_engine(UNSERVABLE)
    assert choice.engine == "embedded_server" and "head_dim=16" in choice.reason
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, rollout_vllm=str(install.python), vllm_weight_publisher="http")
    assert config.settle_rollout_engine(SERVABLE).engine == "embedded_server"
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, rollout_vllm=str(install.python))
    assert config.settle_rollout_engine(SERVABLE, uses_rollout_func=True).engine == "trl"
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, use_vllm=True, vllm_mode="server")
    assert config.settle_rollout_engine(SERVABLE).engine == "vllm_server"


def gkd_config(tmp_path, **fields):
    return ThunderSyncGKDConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **fields)


def test_managed_vllm_asked_for_by_name_refuses_what_auto_falls_back_from(tmp_path, install):
    config = gkd_config(tmp_path, rollout_engine="managed_vllm")
    with pytest.raises(ConfigurationError, match="rollout_engine='managed_vllm': no vLLM installation was found"):
        config.settle_rollout_engine(SERVABLE)
    config = gkd_config(tmp_path, rollout_engine="managed_vllm", rollout_vllm=str(install.python))
    with pytest.raises(UnsupportedOptionError, match="cannot serve this model.*head_dim=16"):
        config.settle_rollout_engine(UNSERVABLE)
    with pytest.raises(ConfigurationError, match="cannot import vllm"):  # a named installation must work
        gkd_config(tmp_path, rollout_vllm=str(tmp_path / "nothing")).settle_rollout_engine(SERVABLE)


@pytest.mark.parametrize("fields, message", [
    (dict(rollout_engine="managed_vllm", use_vllm=True, vllm_mode="server"), "managed_vllm needs: it starts its own"),
    (dict(rollout_engine="managed_vllm", vllm_server_base_urls=["http://10.0.0.5:8000"]), "starts its own servers"),
    (dict(rollout_engine="managed_vllm", vllm_weight_publisher="http"), "vllm_weight_publisher='http'"),
    (dict(rollout_vllm_kv_cache_gib=0.0), "rollout_vllm_kv_cache_gib=0.0 must be > 0"),
])
def test_combinations_the_managed_engine_cannot_honour_are_refused_by_name(tmp_path, fields, message):
    with pytest.raises(ConfigurationError, match=message):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, **fields)


def test_the_managed_engine_is_built_over_the_servers_it_started(monkeypatch, tmp_path, install):
    """rollout_setup: servers started from the policy (reload publisher, no LoRA flags), then the same engine as for
    servers at URLs, with them as its supervisor and vLLM's request semantics (fields, correction)."""
    from trl_thundersync.rollout import vllm_client, vllm_managed
    from trl_thundersync.rollout.vllm_reload import CheckpointReloadPublisher
    from trl_thundersync.trainers.rollout_setup import RolloutTarget, build_turn_generator
    from trl_thundersync.types import SamplingParams

    started, built = {}, {}

    class Servers:
        urls, start_seconds = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"], 42.0

        @classmethod
        def start(cls, model, tokenizer, options, *, replicas, without_adapters):
            started.update(options=options, replicas=replicas, without_adapters=without_adapters)
            return cls()

        def close(self):
            started["closed"] = True

    class Engine:
        def __init__(self, urls, tokenizer, sampling, **kwargs):
            built.update(kwargs, urls=urls)

        def publish(self, model, version):
            built["published"] = version
            return 0.5

    monkeypatch.setattr(vllm_managed, "ManagedVLLMServers", Servers)
    monkeypatch.setattr(vllm_client, "VLLMServerEngine", Engine)
    monkeypatch.setattr("trl_thundersync.rollout.vllm_shapes.check_servable", lambda *a, **k: None)
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, rollout_engine="managed_vllm", rollout_num_servers=2,
                        rollout_vllm=str(install.python), rollout_vllm_kv_cache_gib=0.5,
                        rollout_vllm_args=["--max-num-seqs", "64"], generation_kwargs={"frequency_penalty": 0.2})
    config.settle_rollout_engine(SERVABLE)
    metrics = {}
    threads = torch.get_num_threads()
    try:
        build_turn_generator(RolloutTarget(torch.nn.Linear(1, 1), None, torch.device("cpu"), 1, 3), config,
                             SamplingParams(max_new_tokens=8), on_metric=metrics.__setitem__)
    finally:
        torch.set_num_threads(threads)
    options = started["options"]
    assert started["replicas"] == 2 and not started["without_adapters"] and options.lora_rank is None
    assert options.kv_cache_gib == 0.5 and options.extra_args == ("--max-num-seqs", "64") and options.num_threads == 1
    assert options.install.python == install.python
    assert built["urls"] == Servers.urls and isinstance(built["supervisor"], Servers)
    assert isinstance(built["publisher"], CheckpointReloadPublisher) and built["published"] == 3
    assert built["request_fields"] == {"frequency_penalty": 0.2} and built["importance_sampling"] is True
    assert built["max_concurrency"] is None  # vLLM's own --max-num-seqs, not the embedded server's 16
    assert metrics["thundersync/rollout_server_start_seconds"] == 42.0


def test_lora_publication_starts_the_servers_with_a_rank_that_holds_the_adapter():
    from trl_thundersync.rollout.vllm_managed import lora_rank_flag, managed_publisher

    assert [lora_rank_flag(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ConfigurationError, match="above vLLM's largest --max-lora-rank"):
        lora_rank_flag(1024)
    assert managed_publisher("auto")[0] == "reload" and managed_publisher("lora") == ("lora", "asked for")


def test_the_gkd_config_carries_trls_server_memory_fields():
    names = {f.name for f in dataclasses.fields(ThunderSyncGKDConfig)}
    assert {"vllm_gpu_memory_utilization", "vllm_max_model_length", "rollout_vllm", "rollout_vllm_kv_cache_gib",
            "rollout_vllm_args"} <= names
