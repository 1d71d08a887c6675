"""Issue 14 item 5(b): with PEFT and NCCL the merged policy is streamed in the model's dtype from its own device,
one merged layer at a time, instead of an FP32 CPU copy of the whole model per step (`weights.policy_tensors`)."""

from __future__ import annotations

import pytest
import torch

from trl_thundersync.rollout.vllm_publish import TRLNCCLPublisher
from trl_thundersync.rollout.weights import policy_state_dict, policy_tensors


def _peft_policy(dtype: torch.dtype):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2)
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    return model.to(dtype)


class _Recorder:
    made: list[_Recorder] = []

    def __init__(self, base_url, group_port, connection_timeout):
        self.sent: list[tuple[str, torch.Tensor]] = []
        _Recorder.made.append(self)

    def init_communicator(self, device):
        pass

    def update_named_params(self, metadata, named_params):
        self.metadata = metadata
        self.sent = list(named_params)


def test_a_bf16_lora_policy_is_streamed_in_bf16_without_copying_the_unmerged_tensors(monkeypatch):
    from trl_thundersync.rollout import vllm_publish

    monkeypatch.setattr(vllm_publish, "reset_prefix_cache", lambda url, timeout: 1)
    monkeypatch.setattr(vllm_publish.Acknowledgements, "record", lambda self, url, label: None)
    model = _peft_policy(torch.bfloat16)
    reference = policy_state_dict(model)  # FP32 merge, the HTTP path's weights
    publisher = TRLNCCLPublisher(device="cpu", client_factory=_Recorder)
    publisher.prepare(model, 1)
    publisher.push("http://replica:8000", 1)
    client = _Recorder.made[-1]
    assert [name for name, _, _ in client.metadata] == list(reference)
    assert {dtype for _, dtype, _ in client.metadata} == {"bfloat16"}
    assert [name for name, _ in client.sent] == list(reference)
    base = model.get_base_model().state_dict()
    own = {ptr for t in base.values() for ptr in [t.data_ptr()]}
    for name, tensor in client.sent:
        assert tensor.dtype == torch.bfloat16 and tensor.device.type == "cpu"
        assert list(tensor.shape) == list(reference[name].shape)
        if name.endswith(("q_proj.weight", "v_proj.weight")):  # W + ΔW, merged in FP32, then cast once
            assert torch.equal(tensor, reference[name].to(torch.bfloat16)) and tensor.data_ptr() not in own
        else:  # the model's own tensor: streamed as it is, no copy
            assert tensor.data_ptr() in own
    merged = [n for n, _ in client.sent if n.endswith("q_proj.weight")]
    assert len(merged) == 2  # both layers' adapters are in the stream


def test_the_stream_stays_on_the_models_device():
    model = _peft_policy(torch.float16).to("meta")  # a device other than the CPU, without a GPU
    specs = list(policy_tensors(model, specs=True))
    streamed = list(policy_tensors(model))
    assert [(n, d, s) for n, d, s in specs] == [(n, t.dtype, tuple(t.shape)) for n, t in streamed]
    assert all(t.device.type == "meta" and t.dtype == torch.float16 for _, t in streamed)


def test_a_plain_model_streams_its_parameters_as_they_are():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).to(torch.bfloat16)
    streamed = list(policy_tensors(model))
    assert [n for n, _ in streamed] == [n for n, _ in model.named_parameters()]
    assert all(t.data_ptr() == p.data_ptr() and t.dtype == torch.bfloat16
               for (_, t), p in zip(streamed, model.parameters(), strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_policy_state_dict_is_still_the_fp32_merge(dtype):
    model = _peft_policy(dtype)
    state = policy_state_dict(model)
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in state.values())
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    expected = layer.base_layer.weight.float() + layer.get_delta_weight("default").float()
    assert torch.equal(state["model.layers.0.self_attn.q_proj.weight"], expected)
