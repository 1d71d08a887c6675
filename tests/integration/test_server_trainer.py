"""ThunderSyncGRPOTrainer over HTTP rollout servers: embedded servers started by the trainer, TRL's `use_vllm=True,
vllm_mode="server"` fields pointed at servers started by hand, and the multi-turn agent loop over the server engine.

The embedded server samples with the embedded engine's arithmetic (same seeds, same kernels with one thread), so a
run over HTTP must reach *bit-identical* parameters to the same run with the in-process `LocalProcessEngine`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from benchmarks.parity import cpu_config, load_model, prompt_dataset, relative_error
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.errors import ConfigurationError, UnsupportedOptionError
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.serve.launcher import EmbeddedServers, ServerOptions

pytestmark = pytest.mark.slow


def reward_digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) - len(c) / 16 for c in completions]


@dataclass(frozen=True)
class Run:
    trainer: ThunderSyncGRPOTrainer
    params: torch.Tensor  # all parameters after training, flat
    samples: list[dict[int, tuple[int, ...]]]  # per step: trajectory index -> completion ids
    orders: list[tuple[int, ...]]  # per step: trajectory indices in arrival order


def train(path, tokenizer, out, peft_config=None, **overrides) -> Run:
    common = dict(max_completion_length=12, per_device_train_batch_size=8, num_generations=4, max_steps=2,
                  optim="sgd", learning_rate=0.05, rollout_max_in_flight=4)
    common.update(overrides)
    trainer = ThunderSyncGRPOTrainer(model=load_model(path), reward_funcs=[reward_digits],
                                     args=cpu_config(ThunderSyncGRPOConfig, out, **common),
                                     train_dataset=prompt_dataset(16), processing_class=tokenizer,
                                     peft_config=peft_config)
    samples, orders, barrier = [], [], trainer._barrier

    def spy(totals, timing, normalization, buckets, scored, prompts, *batch):
        samples.append({s.rollout.index: s.rollout.completion_ids for s in scored})
        orders.append(timing.arrival_order)
        return barrier(totals, timing, normalization, buckets, scored, prompts, *batch)

    trainer._barrier = spy
    trainer.train()
    return Run(trainer, torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()]), samples, orders)


def assert_same_update(run: Run, reference: Run) -> None:
    """Identical trajectories; identical parameters when they arrived in the same order, else up to FP32 rounding
    (group statistics are sums in arrival order)."""
    assert run.samples == reference.samples
    if run.orders == reference.orders:
        assert torch.equal(run.params, reference.params)
    else:
        assert relative_error(run.params, reference.params) <= 1e-6


@pytest.fixture(scope="module")
def local_run(tiny_model_path, tokenizer, tmp_path_factory):
    """The reference: the same run with the in-process embedded engine."""
    return train(tiny_model_path, tokenizer, tmp_path_factory.mktemp("local"), rollout_engine="local_process")


def test_embedded_servers_sync_and_thundersync_reach_the_local_engine_parameters(tmp_path, tokenizer,
                                                                                  tiny_model_path, local_run):
    runs = {schedule: train(tiny_model_path, tokenizer, tmp_path / schedule, schedule=schedule,
                            rollout_engine="embedded_server", rollout_num_servers=2)
            for schedule in ("thundersync", "sync")}
    assert_same_update(runs["sync"], runs["thundersync"])
    for run in runs.values():
        assert_same_update(run, local_run)
        assert run.trainer.policy_version == 2 and run.trainer._engine is None  # closed: servers stopped
    trainer = runs["thundersync"].trainer
    logs = [h for h in trainer.state.log_history if "rollout/replica1/policy_version" in h]
    assert [h["rollout/replica0/policy_version"] for h in logs] == [0.0, 1.0]  # the version each batch ran at
    assert all(h["rollout/replica1/tokens_per_s"] > 0 and h["rollout/turn_latency_p90_s"] > 0 for h in logs)
    assert all(1 <= h["rollout/in_flight_peak"] <= 8 for h in logs)
    publications = [h["thundersync/publish_seconds"] for h in trainer.state.log_history
                    if "thundersync/publish_seconds" in h]
    assert publications and all(s > 0 for s in publications)
    steps = [json.loads(line) for line in (Path(tmp_path / "thundersync" / "thundersync_trace" / "steps.jsonl")
                                           .read_text().splitlines())]
    spans = [e for step in steps for e in step["events"] if e["kind"] == "publish"]
    assert len(spans) == 2 and all(e["end"] > e["start"] for e in spans)


def test_trl_vllm_server_fields_drive_several_servers_started_by_hand(tmp_path, tokenizer, tiny_model_path,
                                                                      local_run):
    # `python -m trl_thundersync.serve --model DIR` twice, from a different model than the policy: the trainer must
    # publish θ_0 before the first batch and θ_1 after the first step, and both servers must acknowledge. The
    # importance-sampling correction is off so that the update is the local engine's (tested against TRL elsewhere).
    other = load_model(tiny_model_path)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    servers = EmbeddedServers.start(other, tokenizer, replicas=2, options=ServerOptions(max_in_flight=4))
    try:
        run = train(tiny_model_path, tokenizer, tmp_path, use_vllm=True, vllm_mode="server",
                    vllm_server_base_urls=servers.urls, vllm_importance_sampling_correction=False)
        probe = VLLMServerEngine(servers.urls, tokenizer, run.trainer._sampling_params(), policy_version=2)
        probe.close()  # constructing it checks that every server reports version 2
    finally:
        servers.close()
    assert_same_update(run, local_run)
    assert all(p.poll() is not None for p in servers.processes)


def test_lora_adapters_published_as_versions_match_merged_weights(tmp_path, tokenizer, tiny_model_path):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    common = dict(peft_config=lora, learning_rate=0.5, max_steps=3)
    merged = train(tiny_model_path, tokenizer, tmp_path / "local", rollout_engine="local_process", **common)
    adapters = train(tiny_model_path, tokenizer, tmp_path / "lora", rollout_engine="embedded_server",
                     vllm_weight_publisher="lora", **common)
    assert_same_update(adapters, merged)
    trained = [p for n, p in adapters.trainer.model.named_parameters() if "lora_B" in n]
    assert trained and all(p.abs().max() > 0 for p in trained)  # policy-v1, -v2 differ from the base weights
    logs = [h for h in adapters.trainer.state.log_history if "rollout/replica0/policy_version" in h]
    assert [h["rollout/replica0/policy_version"] for h in logs] == [0.0, 1.0, 2.0]  # served as policy-v0, -v1, -v2


def test_agent_loop_over_the_server_engine_matches_the_local_engine(tmp_path, tokenizer, tiny_model_path):
    from datasets import Dataset

    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return key.upper()

    def reward_len(completion_ids, **kwargs):
        return [float(len(c)) for c in completion_ids]

    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Find key {i}."}] for i in range(8)]})
    params = {}
    for engine in ("local_process", "embedded_server"):
        args = cpu_config(ThunderSyncGRPOConfig, tmp_path / engine, max_steps=2, max_completion_length=16,
                          max_tool_calling_iterations=1, optim="sgd", rollout_engine=engine)
        trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len], args=args,
                                         train_dataset=data, processing_class=tokenizer, tools=[lookup])
        trainer.train()
        assert trainer.policy_version == 2
        params[engine] = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    assert relative_error(params["embedded_server"], params["local_process"]) <= 1e-6  # same turns, any order
    log = next(h for h in trainer.state.log_history if "agent/turns_mean" in h)
    assert log["agent/turns_mean"] >= 1 and "rollout/replica0/tokens_per_s" in log


@pytest.mark.parametrize("overrides, error, match", [
    (dict(use_vllm=True), UnsupportedOptionError, "vllm_mode='colocate'"),
    (dict(use_vllm=True, vllm_mode="server", loss_type="vespo"), UnsupportedOptionError, "vespo"),
    (dict(vllm_server_base_urls=["http://a:8000"]), ConfigurationError, "also set use_vllm=True"),
    (dict(rollout_engine="vllm_server"), ConfigurationError, "needs use_vllm=True"),
    (dict(use_vllm=True, vllm_mode="server", vllm_importance_sampling_correction=False,
          rollout_engine="local_process"), ConfigurationError, "rollout_engine='local_process'"),
    (dict(vllm_weight_publisher="rsync"), ConfigurationError, "vllm_weight_publisher='rsync'"),
])
def test_server_config_errors_name_the_field(tmp_path, overrides, error, match):
    with pytest.raises(error, match=match):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, **overrides)


def test_server_urls_follow_trl_fields(tmp_path):
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, use_vllm=True, vllm_mode="server", vllm_server_host="10.0.0.5",
                      vllm_server_port=8001)
    assert args.resolved_rollout_engine(False) == "vllm_server"
    assert args.server_urls() == ["http://10.0.0.5:8001"]
    args.vllm_server_base_url = "http://gpu-node:8000"
    assert args.server_urls() == ["http://gpu-node:8000"]
    args.vllm_server_base_urls = ["http://a:8000", "http://b:8000"]
    assert args.server_urls() == ["http://a:8000", "http://b:8000"]
    embedded = cpu_config(ThunderSyncGRPOConfig, tmp_path, rollout_engine="embedded_server")
    assert embedded.server_urls() is None  # started by the trainer


def test_agent_context_is_capped_by_the_servers_context_window(tmp_path, tokenizer, tiny_model_path):
    """A trajectory that outgrows the model's window ends as `max_context_tokens` (truncated) instead of sending a
    request the server refuses (vLLM answers HTTP 400 past max_model_len)."""
    from datasets import Dataset

    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return "value " * 40

    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Find key {i}."}] for i in range(4)]})
    prompt = tokenizer.apply_chat_template(data[0]["prompt"], tools=[lookup], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    window = len(prompt) + 24  # room for a turn or two, not for max_completion_length
    model = load_model(tiny_model_path)
    model.config.max_position_embeddings = window  # the embedded server reports and enforces it, like vLLM
    # the paper protocol's per-turn budget shrinks to the window (asserted below); the TRL protocol's is the test after
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, max_steps=1, max_completion_length=64, num_generations=4,
                      per_device_train_batch_size=4, agent_max_turns=4, rollout_engine="embedded_server",
                      agent_protocol="paper")
    def reward_len(completion_ids, **kwargs):
        return [float(len(c)) for c in completion_ids]

    trainer = ThunderSyncGRPOTrainer(model=model, reward_funcs=[reward_len], args=args, train_dataset=data,
                                     processing_class=tokenizer, tools=[lookup])
    trainer.train()
    assert trainer.policy_version == 1
    log = next(h for h in trainer.state.log_history if "agent/turns_mean" in h)
    # every trajectory was cut at the window (the turn budget shrank to what fits), none was refused by the server
    assert log["completions/max_length"] == window - len(prompt) and log["completions/clipped_ratio"] == 1, log
    engine = trainer._rollout_engine()
    assert engine.generator.max_model_len == window
    assert engine.limits.max_context_tokens == window


def test_trl_protocol_turns_stop_at_the_servers_context_window(tmp_path, tokenizer, tiny_model_path):
    """agent_protocol="trl": a turn never asks past the window (TRL's request would fail there); the episode is
    cut at the window instead of refused by the server."""
    from datasets import Dataset

    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return "value " * 40

    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Find key {i}."}] for i in range(4)]})
    prompt = tokenizer.apply_chat_template(data[0]["prompt"], tools=[lookup], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    window = len(prompt) + 24
    model = load_model(tiny_model_path)
    model.config.max_position_embeddings = window
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, max_steps=1, max_completion_length=64, num_generations=4,
                      per_device_train_batch_size=4, rollout_engine="embedded_server")

    def reward_len(completion_ids, **kwargs):
        return [float(len(c)) for c in completion_ids]

    trainer = ThunderSyncGRPOTrainer(model=model, reward_funcs=[reward_len], args=args, train_dataset=data,
                                     processing_class=tokenizer, tools=[lookup])
    trainer.train()
    assert trainer.policy_version == 1
    log = next(h for h in trainer.state.log_history if "agent/turns_mean" in h)
    assert log["completions/max_length"] <= window - len(prompt), log
    assert trainer._rollout_engine().limits.max_context_tokens == window
