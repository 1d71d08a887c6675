"""Full-weight publication without NCCL (issue 24 items 4, 5): `CheckpointReloadPublisher` against a stub of vLLM
0.32's dev-mode reload (`tests/fixtures/vllm_dev_stub.py`: `/collective_rpc reload_weights`, `/weight_checker`,
the version routes), the tied output embedding written explicitly, content confirmed by hash where the server can
see it; what 'auto' picks; and the publisher defects: the LoRA publisher's base-weight check, 'http' against vLLM,
TRL's NCCL client on a CPU device. The same publication against a real vLLM server: `tests/real_vllm/`.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors import safe_open

from tests.fixtures.vllm_dev_stub import VLLMDevStub
from trl_thundersync.errors import ConfigurationError, RolloutError, ServerBaseWeightsError
from trl_thundersync.rollout import publisher_choice
from trl_thundersync.rollout.publisher_choice import auto_publisher, make_publisher
from trl_thundersync.rollout.server_acks import confirm_all
from trl_thundersync.rollout.vllm_publish import HTTPWeightFile, LoRAAdapterPublisher, TRLNCCLPublisher
from trl_thundersync.rollout.vllm_reload import CHECKPOINT_FILE, CheckpointReloadPublisher, write_checkpoint


def _tied_policy(seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def _perturb(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.1)


def _file_tensors(folder) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / CHECKPOINT_FILE), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def _served_as_vllm(model) -> dict[str, torch.Tensor]:
    """What vLLM holds after loading `model`: its fused layouts, tied lm_head not a parameter of its own."""
    state = {n: t.detach().float() for n, t in model.state_dict().items() if n != "lm_head.weight"}
    out = {}
    for name, tensor in state.items():
        if ".k_proj." in name or ".v_proj." in name or ".up_proj." in name:
            continue
        if ".q_proj." in name:
            parts = [state[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            name, tensor = name.replace("q_proj", "qkv_proj"), torch.cat(parts)
        elif ".gate_proj." in name:
            name, tensor = name.replace("gate_proj", "gate_up_proj"), torch.cat([tensor, state[
                name.replace("gate_proj", "up_proj")]])
        out[name] = tensor
    return out


@pytest.fixture
def stub():
    server = VLLMDevStub()
    yield server
    server.stop()


# -- the checkpoint ---------------------------------------------------------------------------------------------------
def test_a_tied_policy_is_written_with_its_lm_head_explicitly(tmp_path):
    model = _tied_policy()
    assert "lm_head.weight" in model.state_dict()

    def drop_tied(module, state, prefix, local_metadata):
        state.pop(f"{prefix}lm_head.weight", None)

    model._register_state_dict_hook(drop_tied)
    assert "lm_head.weight" not in model.state_dict()  # what save_pretrained writes for a tied model
    write_checkpoint(model, tmp_path / "v1")
    tensors = _file_tensors(tmp_path / "v1")
    assert torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    assert json.loads((tmp_path / "v1" / "config.json").read_text())["tie_word_embeddings"] is True


def test_a_lora_policy_is_written_merged_with_its_lm_head(tmp_path):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(_tied_policy(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    write_checkpoint(peft_model, tmp_path / "v1")
    tensors = _file_tensors(tmp_path / "v1")
    assert not any("lora" in name or "base_layer" in name for name in tensors)
    assert "lm_head.weight" in tensors
    layer = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    merged = layer.base_layer.weight + layer.get_delta_weight("default")
    torch.testing.assert_close(tensors["model.layers.0.self_attn.q_proj.weight"], merged, rtol=0, atol=1e-6)


# -- publication against vLLM's dev-mode reload ---------------------------------------------------------------------
def test_a_version_is_reloaded_confirmed_by_hash_and_labelled(stub, tmp_path):
    model = _tied_policy()
    publisher = CheckpointReloadPublisher(tmp_path / "shared")
    publisher.prepare(model, 1)
    publisher.push(stub.url, 1)
    label = f"{publisher.prefix}-v1"
    folder = next((tmp_path / "shared").iterdir()) / label
    paths = [path.split("?")[0] for _, path, _ in stub.calls]
    assert paths == ["/collective_rpc", "/reset_prefix_cache", "/weight_checker", "/server_info",
                     "/update_weight_version", "/weight_info"]  # the label is stored after the content check
    assert stub.calls[0][2] == {"method": "reload_weights", "kwargs": {"weights_path": str(folder.resolve())},
                                "timeout": publisher.timeout}
    expected = _served_as_vllm(model)
    assert stub.parameters.keys() == expected.keys() and "model.layers.0.self_attn.qkv_proj.weight" in expected
    assert all(torch.equal(stub.parameters[n], t) for n, t in expected.items())
    assert stub.weight_version == label and publisher.confirm(stub.url, 1) is None
    _perturb(model, 1)
    publisher.prepare(model, 2)
    publisher.push(stub.url, 2)
    publisher.retire([stub.url], 1)
    assert not folder.exists() and (folder.parent / f"{publisher.prefix}-v2" / CHECKPOINT_FILE).exists()
    publisher.close()
    assert list((tmp_path / "shared").iterdir()) == []


def test_a_restarted_replica_is_reloaded_before_the_batch(tmp_path):
    started_with = _tied_policy()
    server = VLLMDevStub(initial=_served_as_vllm(started_with))
    try:
        model = _tied_policy()
        _perturb(model, 3)
        publisher = CheckpointReloadPublisher(tmp_path)
        publisher.prepare(model, 4)
        publisher.push(server.url, 4)
        server.restart()  # back with the checkpoint it was started with, labelled "default"
        assert "reports weight version 'default'" in publisher.confirm(server.url, 4)
        confirm_all([server.url], publisher, 4)  # restored: reloaded from version 4's folder
        assert server.weight_version == f"{publisher.prefix}-v4"
        assert all(torch.equal(server.parameters[n], t) for n, t in _served_as_vllm(model).items())
        publisher.close()
        assert not publisher.restore(server.url, 4)  # its folder is gone: the engine then fails loudly
    finally:
        server.stop()


def test_a_parameter_the_reload_skipped_fails_the_publication_by_name(tmp_path):
    model = _tied_policy()
    server = VLLMDevStub(tied=False)  # lm_head its own buffer, as in vLLM's CPU build
    try:
        publisher = CheckpointReloadPublisher(tmp_path)
        publisher.prepare(model, 0)
        publisher.push(server.url, 0)  # the run's first publication: the server now holds version 0
        server.skipped = frozenset({"lm_head.weight"})  # a reload that leaves lm_head as it was
        _perturb(model, 1)
        publisher.prepare(model, 1)
        with pytest.raises(RolloutError, match=r"1 parameter\(s\) still hold version 0's bytes \(lm_head.weight\)"):
            publisher.push(server.url, 1)
        assert server.weight_version == f"{publisher.prefix}-v0"  # never labelled with the version it lacks
        publisher.close()
    finally:
        server.stop()


def test_layers_the_server_hashes_as_empty_are_confirmed_by_label_said_once(tmp_path, caplog):
    server = VLLMDevStub(repacked=True)  # vLLM's CPU build: repacked linear layers hash as empty tensors
    model = _tied_policy()
    try:
        publisher = CheckpointReloadPublisher(tmp_path)
        with caplog.at_level(logging.INFO, logger="trl_thundersync.rollout.vllm_reload"):
            for version in (1, 2):
                _perturb(model, version)
                publisher.prepare(model, version)
                publisher.push(server.url, version)
        told = [r.getMessage() for r in caplog.records if "hashed as empty" in r.getMessage()]
        assert len(told) == 1 and "confirmed by the weight label only" in told[0]
        assert "4 hashed as empty" in told[0]  # qkv, o, gate_up, down of the one layer
        publisher.close()
    finally:
        server.stop()


def test_a_folder_the_server_cannot_read_names_the_shared_folder(stub, tmp_path):
    import shutil

    publisher = CheckpointReloadPublisher(tmp_path)
    publisher.prepare(_tied_policy(), 1)
    shutil.rmtree(next(tmp_path.iterdir()))  # as if the server looked on another host's filesystem
    with pytest.raises(RolloutError, match="could not read the checkpoint of version 1") as caught:
        publisher.push(stub.url, 1)
    assert "vllm_publish_dir" in str(caught.value) and "restart the server" in str(caught.value)
    assert "Repo id must be in the form" in str(caught.value)  # vLLM's own text
    assert stub.engine_dead


def test_a_server_on_another_host_is_refused_before_the_temp_folder_is_sent(tmp_path):
    publisher = CheckpointReloadPublisher()  # no vllm_publish_dir: the trainer's temp folder
    publisher.prepare(_tied_policy(), 1)
    with pytest.raises(ConfigurationError, match=r"http://192.0.2.1:8000 \(another host\) cannot read.*set "
                                                 "vllm_publish_dir"):
        publisher.push("http://192.0.2.1:8000", 1)  # TEST-NET-1: never this machine, and never contacted
    publisher.close()


def test_a_server_without_dev_mode_is_refused_naming_it(tmp_path):
    server = VLLMDevStub(version_routes=False)
    try:
        publisher = CheckpointReloadPublisher(tmp_path)
        publisher.prepare(_tied_policy(), 1)
        with pytest.raises(RolloutError, match="has no POST /collective_rpc .* VLLM_SERVER_DEV_MODE=1"):
            publisher.push(server.url, 1)
        publisher.close()
    finally:
        server.stop()


# -- which publisher ------------------------------------------------------------------------------------------------
def test_auto_picks_nccl_only_where_it_can_work_and_says_why(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="trl_thundersync.rollout.publisher_choice"):
        publisher = make_publisher("auto", [None, None], {"device": torch.device("cpu")})
    assert isinstance(publisher, CheckpointReloadPublisher)
    assert "chose 'reload': NCCL cannot work here (the learner's device is cpu" in caplog.text
    assert isinstance(make_publisher("auto", [0, 0]), HTTPWeightFile)  # embedded servers
    assert auto_publisher(vllm=True, device="cuda", directory=True)[0] == "reload"
    monkeypatch.setattr(publisher_choice.importlib.util, "find_spec", lambda name: object())
    assert auto_publisher(vllm=True, device="cuda:0", directory=False)[0] == "nccl"
    monkeypatch.setattr(publisher_choice.importlib.util, "find_spec", lambda name: None)
    name, reason = auto_publisher(vllm=True, device="cuda:0", directory=False)
    assert name == "reload" and "vLLM is not installed" in reason


def test_a_publisher_the_servers_cannot_load_from_is_refused_at_start(stub):
    with pytest.raises(ConfigurationError, match=r"'http' .* vLLM servers do not have; for vLLM use 'reload'"):
        make_publisher("http", [None])
    with pytest.raises(ConfigurationError, match="'reload' .* embedded servers do not have"):
        make_publisher("reload", [0])
    publisher = HTTPWeightFile()  # handed in directly: refused at its first push, not as replicas out of step
    publisher.prepare(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ConfigurationError, match=f"which {stub.url} does not serve .* use 'reload'"):
        publisher.push(stub.url, 1)
    publisher.close()


def test_trls_nccl_client_never_escapes_raw_on_a_cpu_device():
    with pytest.raises(ConfigurationError, match="'nccl' .* learner's device is 'cpu'; use 'reload'"):
        TRLNCCLPublisher(device="cpu")  # TRL's own client would raise NotImplementedError at its first push

    class NoCUDA:
        def __init__(self, **kwargs):
            pass

        def init_communicator(self, device):
            raise NotImplementedError("Weight synchronization runs on vLLM's NCCL weight-transfer engine, which "
                                      f"needs a CUDA device, got '{device}'.")

    class Unreachable(NoCUDA):
        def init_communicator(self, device):
            raise Exception("Request failed: 404, {'detail': 'Not Found'}")  # TRL's bare Exception

    for factory, error, text in ((NoCUDA, ConfigurationError, "cannot publish from device 'cpu'"),
                                 (Unreachable, RolloutError, "could not open a weight-transfer group")):
        publisher = TRLNCCLPublisher(device="cpu", client_factory=factory)
        publisher.prepare(torch.nn.Linear(2, 2), 1)
        with pytest.raises(error, match=text):
            publisher.push("http://a:8000", 1)


# -- LoRA: the server's base weights ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def peft_policy():
    from peft import LoraConfig, get_peft_model

    return get_peft_model(_tied_policy(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))


def test_lora_refuses_a_server_whose_base_a_full_weight_run_replaced(stub, peft_policy):
    stub.weight_version = "policy-0123abcd-v2"  # left by a full-weight run on this long-lived server
    publisher = LoRAAdapterPublisher()
    publisher.prepare(peft_policy, 0)
    with pytest.raises(ServerBaseWeightsError, match="labelled 'policy-0123abcd-v2' .* not the checkpoint") as caught:
        publisher.push(stub.url, 0)
    assert (caught.value.url, caught.value.label) == (stub.url, "policy-0123abcd-v2")
    assert stub.adapters == {}  # nothing was loaded on it
    publisher.close()


def test_lora_checks_the_base_again_before_every_batch(stub, peft_policy):
    publisher = LoRAAdapterPublisher()
    publisher.prepare(peft_policy, 1)
    publisher.push(stub.url, 1)  # the server reports "default": the checkpoint it was started with
    confirm_all([stub.url], publisher, 1)
    stub.weight_version = "policy-fedcba98-v5"  # another trainer published full weights to it meanwhile
    with pytest.raises(ServerBaseWeightsError, match="policy-fedcba98-v5"):
        confirm_all([stub.url], publisher, 1)
    publisher.close()


def test_lora_on_a_server_without_version_routes_is_logged_not_refused(peft_policy, caplog):
    server = VLLMDevStub(version_routes=False)
    try:
        publisher = LoRAAdapterPublisher()
        with caplog.at_level(logging.WARNING, logger="trl_thundersync.rollout.vllm_publish"):
            for version in (1, 2):
                publisher.prepare(peft_policy, version)
                publisher.push(server.url, version)
        assert caplog.text.count("its base weights cannot be checked") == 1
        publisher.close()
    finally:
        server.stop()


# -- the config fields ------------------------------------------------------------------------------------------------
def test_the_config_accepts_reload_with_a_publish_dir_and_refuses_what_cannot_work(tmp_path):
    from benchmarks.parity import cpu_config
    from trl_thundersync import ThunderSyncGRPOConfig

    vllm = dict(use_vllm=True, vllm_mode="server")
    shared = str(tmp_path / "shared")
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, **vllm, vllm_publish_dir=shared)
    assert config.resolved_weight_publisher() == "reload"  # a folder the servers read: checkpoints, not NCCL
    assert cpu_config(ThunderSyncGRPOConfig, tmp_path, **vllm).resolved_weight_publisher("cpu") == "reload"
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, **vllm, vllm_weight_publisher="reload",
                        vllm_publish_dir=shared)
    assert config.resolved_weight_publisher() == "reload"
    with pytest.raises(ConfigurationError, match="vllm_weight_publisher='nccl' sends the weights over NCCL"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, **vllm, vllm_weight_publisher="nccl", vllm_publish_dir=shared)
    with pytest.raises(ConfigurationError, match=r"vllm_weight_publisher='http' .* use 'reload'"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, **vllm, vllm_weight_publisher="http")
    with pytest.raises(ConfigurationError, match="vllm_weight_publisher='reload' loads checkpoints"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, vllm_weight_publisher="reload", rollout_engine="embedded_server")
    # rollout_engine='auto' may pick managed vLLM servers (decided with the model, trainers/rollout_choice.py)
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, vllm_weight_publisher="reload", rollout_engine="managed_vllm")
    assert config.resolved_weight_publisher("cpu") == "reload"


def test_a_lora_engine_refuses_a_replaced_base_at_start_before_its_first_batch(stub):
    """The first batch samples the base model itself (no adapter yet): the base is checked when the engine starts."""
    from trl_thundersync.rollout.vllm_client import VLLMServerEngine
    from trl_thundersync.types import SamplingParams

    stub.weight_version = "policy-0123abcd-v2"
    with pytest.raises(ServerBaseWeightsError, match="labelled 'policy-0123abcd-v2'"):
        VLLMServerEngine([stub.url], None, SamplingParams(max_new_tokens=4), publisher="lora", startup_timeout=10.0)
    stub.weight_version = "default"
    VLLMServerEngine([stub.url], None, SamplingParams(max_new_tokens=4), publisher="lora", startup_timeout=10.0).close()
