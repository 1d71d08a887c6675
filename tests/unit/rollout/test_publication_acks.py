"""Publication against servers that behave like released vLLM (issue 14 items 1, 2, 3): adapter names unique per run
and unloaded at close, a shared adapter folder, vLLM's own error texts for a missing route and an unreadable path,
the weight version the server confirms (vLLM >= 0.27 `/update_weight_version`, `/weight_info`) read back before a
batch, and `/reset_prefix_cache`'s `{"success": false}` retried. The stub answers with vLLM 0.27's statuses and
texts (`tests/fixtures/vllm_dev_stub.py`); the embedded server's strictness is tested against the same texts.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures.vllm_dev_stub import VLLMDevStub
from trl_thundersync.errors import AdapterLoadError, ConfigurationError, ReplicaRestartedError, RolloutError
from trl_thundersync.rollout.server_acks import (
    RESET_ATTEMPTS,
    adapter_load_error,
    confirm_all,
    reset_prefix_cache,
    route_absent,
)
from trl_thundersync.rollout.vllm_api import HTTPReply
from trl_thundersync.rollout.vllm_publish import LoRAAdapterPublisher, TRLNCCLPublisher


@pytest.fixture
def stub():
    server = VLLMDevStub()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def peft_policy():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    return model


def _reply(status: int, body) -> HTTPReply:
    return HTTPReply(status, {}, json.dumps(body).encode())


# -- vLLM's answers, classified --------------------------------------------------------------------------------------
def test_a_missing_route_and_an_unreadable_path_are_told_apart_with_vllms_text():
    absent = adapter_load_error("http://h:8000", "policy-ab-v1", "/local/x", _reply(404, {"detail": "Not Found"}))
    assert absent.kind == "route absent" and "--enable-lora" in str(absent)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in str(absent)
    vllm_404 = {"error": {"message": "Loading lora policy-ab-v1 failed: No adapter found for <path>",
                          "type": "NotFoundError", "param": None, "code": 404}}
    unreadable = adapter_load_error("http://h:8000", "policy-ab-v1", "/local/x", _reply(404, vllm_404))
    assert unreadable.kind == "path unreadable" and "vllm_publish_dir" in str(unreadable)
    assert "No adapter found for <path>" in str(unreadable) and "/local/x" in str(unreadable)  # vLLM masks it
    assert "--enable-lora" not in str(unreadable)
    duplicate = {"error": {"message": "The lora adapter 'a' has already been loaded. If you want to load the adapter "
                                      "in place, set 'load_inplace' to True.", "type": "InvalidUserInput", "code": 400}}
    assert adapter_load_error("u", "a", "/p", _reply(400, duplicate)).kind == "duplicate name"
    failed = {"error": {"message": "[Errno 13] Permission denied: '<path>'", "type": "InternalServerError",
                        "code": 500}}
    other = adapter_load_error("u", "a", "/p", _reply(500, failed))
    assert other.kind == "refused" and "Permission denied" in other.server_message


def test_route_absent_is_the_frameworks_404_only():
    assert route_absent(_reply(404, {"detail": "Not Found"}))
    assert route_absent(HTTPReply(404, {}, b"<html>404</html>"))
    assert not route_absent(_reply(404, {"error": {"message": "The model `x` does not exist.", "code": 404}}))
    assert not route_absent(_reply(404, {"object": "error", "message": "old vLLM shape", "code": 404}))
    assert not route_absent(_reply(200, {}))


def test_reset_prefix_cache_retries_success_false_a_bounded_number_of_times():
    waits: list[float] = []
    server = VLLMDevStub(reset_failures=2)
    try:
        assert reset_prefix_cache(server.url, 5.0, sleep=waits.append) == 3
        assert waits == [0.2, 0.4]
        server.reset_failures = RESET_ATTEMPTS
        with pytest.raises(RolloutError, match=r"answered \{'success': false\} to /reset_prefix_cache 5 times"):
            reset_prefix_cache(server.url, 5.0, sleep=waits.append)
    finally:
        server.stop()


# -- LoRA: names per run, unload at close, the shared folder --------------------------------------------------------
def test_two_runs_and_a_resume_on_one_long_lived_server_never_reuse_an_adapter_name(stub, peft_policy):
    runs = [(0, 3), (0, 3), (2, 4)]  # a first run, a second run from scratch, a resume from version 2
    for first, end in runs:
        publisher = LoRAAdapterPublisher()
        previous = None
        for version in range(first, end):
            publisher.prepare(peft_policy, version)
            publisher.push(stub.url, version)
            if previous is not None:
                publisher.retire([stub.url], previous)
            previous = version
        assert list(stub.adapters) == [f"{publisher.prefix}-v{end - 1}"]  # the previous ones are unloaded
        publisher.close()
        assert stub.adapters == {}  # the last one too: the server keeps nothing of the run
    loads = [body["lora_name"] for method, path, body in stub.calls if path == "/v1/load_lora_adapter"]
    assert len(loads) == len(set(loads)) == 3 + 3 + 2
    assert all(name.startswith("policy-") and name.split("-")[1] != "" for name in loads)


def test_adapters_are_written_to_the_shared_folder_and_removed_from_it_at_close(stub, peft_policy, tmp_path):
    shared = tmp_path / "shared"
    publisher = LoRAAdapterPublisher(shared)
    publisher.prepare(peft_policy, 1)
    publisher.push(stub.url, 1)
    (sent,) = [body["lora_path"] for _, path, body in stub.calls if path == "/v1/load_lora_adapter"]
    run_folder = next(shared.iterdir())
    assert sent.startswith(str(run_folder.resolve())) and (run_folder.stat().st_mode & 0o777) == 0o755
    assert (run_folder / f"{publisher.prefix}-v1" / "adapter_config.json").exists()
    publisher.close()
    assert shared.is_dir() and list(shared.iterdir()) == []  # the run's subfolder is gone, the folder stays


def test_a_server_that_cannot_read_the_adapter_fails_naming_the_path_not_the_lora_flags(peft_policy, tmp_path):
    remote = VLLMDevStub(readable=lambda path: path.startswith("/mnt/shared/"))  # another host's filesystem
    absent = VLLMDevStub(lora_routes=False)
    try:
        publisher = LoRAAdapterPublisher(tmp_path)
        publisher.prepare(peft_policy, 1)
        with pytest.raises(AdapterLoadError, match="cannot read adapter .* No adapter found for <path>") as caught:
            publisher.push(remote.url, 1)
        assert caught.value.kind == "path unreadable" and caught.value.url == remote.url
        with pytest.raises(AdapterLoadError, match="has no /v1/load_lora_adapter route") as caught:
            publisher.push(absent.url, 1)
        assert caught.value.kind == "route absent"
        publisher.close()
    finally:
        remote.stop()
        absent.stop()


def test_a_lora_replica_that_forgot_its_adapter_is_given_it_again_before_the_batch(stub, peft_policy):
    publisher = LoRAAdapterPublisher()
    publisher.prepare(peft_policy, 1)
    publisher.push(stub.url, 1)
    assert publisher.confirm(stub.url, 1) is None
    stub.restart()
    assert "no longer lists adapter" in publisher.confirm(stub.url, 1)
    confirm_all([stub.url], publisher, 1)  # restored: loaded again
    assert list(stub.adapters) == [f"{publisher.prefix}-v1"]
    publisher.close()


# -- the weight version the server confirms -------------------------------------------------------------------------
class _FakeClient:
    def __init__(self, base_url, group_port, connection_timeout):
        pass

    def init_communicator(self, device):
        pass

    def update_named_params(self, metadata, named_params):
        for _ in named_params:
            pass


def test_a_full_weight_replica_that_restarted_is_refused_before_the_batch_naming_it(stub):
    publisher = TRLNCCLPublisher(device="cpu", client_factory=_FakeClient)
    publisher.prepare(torch.nn.Linear(2, 2), 3)
    publisher.push(stub.url, 3)
    assert stub.weight_version == f"{publisher.prefix}-v3" and publisher.confirm(stub.url, 3) is None
    confirm_all([stub.url], publisher, 3)
    stub.restart()  # came back serving its checkpoint weights: vLLM reports "default"
    with pytest.raises(ReplicaRestartedError, match=f"{stub.url} reports weight version 'default'") as caught:
        confirm_all([stub.url], publisher, 3)
    assert caught.value.url == stub.url
    stub.weight_version = "policy-0123abcd-v3"  # another run published to it
    with pytest.raises(ReplicaRestartedError, match="another trainer published to it"):
        confirm_all([stub.url], publisher, 3)


def test_a_replica_that_is_down_before_the_batch_is_left_to_the_request_path(stub):
    publisher = TRLNCCLPublisher(device="cpu", client_factory=_FakeClient)
    publisher.prepare(torch.nn.Linear(2, 2), 1)
    publisher.push(stub.url, 1)
    stub.stop()  # its requests will wait for it to come back, and its recovery puts the version back (or fails)
    confirm_all([stub.url], publisher, 1)


def test_servers_without_the_version_routes_are_unchecked_not_refused():
    old = VLLMDevStub(version_routes=False)  # vLLM <= 0.26, or no VLLM_SERVER_DEV_MODE
    try:
        publisher = TRLNCCLPublisher(device="cpu", client_factory=_FakeClient)
        publisher.prepare(torch.nn.Linear(2, 2), 1)
        publisher.push(old.url, 1)
        assert publisher._acks.unchecked == (old.url,)
        old.restart()
        confirm_all([old.url], publisher, 1)  # nothing to read back: not detected (README says so)
    finally:
        old.stop()


# -- the config field -----------------------------------------------------------------------------------------------
def test_the_publish_dir_field_is_refused_where_nothing_is_written(tmp_path):
    from benchmarks.parity import cpu_config
    from trl_thundersync import ThunderSyncGRPOConfig

    with pytest.raises(ConfigurationError, match="vllm_publish_dir=.*NCCL"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, use_vllm=True, vllm_mode="server", vllm_weight_publisher="nccl",
                   vllm_publish_dir=str(tmp_path))
    with pytest.raises(ConfigurationError, match="publishes to no server"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, rollout_engine="local_process", vllm_publish_dir=str(tmp_path))
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigurationError, match="is not a folder"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, vllm_publish_dir=str(tmp_path / "file"))
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, use_vllm=True, vllm_mode="server",
                        vllm_weight_publisher="lora", vllm_publish_dir=str(tmp_path / "adapters"))
    assert config.vllm_publish_dir == str(tmp_path / "adapters")
