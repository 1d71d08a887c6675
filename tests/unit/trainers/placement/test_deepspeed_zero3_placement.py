"""The ZeRO-3 placement's replica logic on the tiny model, with a fake engine and DeepSpeed's gather replaced by a
no-op (the parameters here are whole; the real partitioned run: tests/integration/test_deepspeed.py, case zero3)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType

from benchmarks.parity import load_model
from trl_thundersync.trainers.placement.deepspeed import deepspeed_placement
from trl_thundersync.trainers.placement.deepspeed_zero3 import ZeRO3Placement

pytest.importorskip("deepspeed", reason="DeepSpeed is installed by scripts/setup.sh (CI)")


class _Engine:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def set_gradient_accumulation_boundary(self, is_boundary):
        self.calls.append(("boundary", is_boundary))

    def backward(self, loss, scale_wrt_gas=True):
        self.calls.append(("backward", scale_wrt_gas))
        loss.backward()

    def step(self):
        self.calls.append(("step",))


def _placement(monkeypatch) -> ZeRO3Placement:
    accelerator = SimpleNamespace(
        state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config={"zero_optimization": {"stage": 3}})),
        distributed_type=DistributedType.DEEPSPEED, num_processes=1, is_main_process=True, device=torch.device("cpu"),
        deepspeed_engine_wrapped=SimpleNamespace(engine=_Engine()), unwrap_model=lambda model: model)
    args = SimpleNamespace(beta=0.0, num_iterations=1, temperature=0.7, cast_lm_head_to_fp32=False)
    placement = deepspeed_placement(accelerator, args)
    assert isinstance(placement, ZeRO3Placement) and placement.name == "DeepSpeed ZeRO-3"
    monkeypatch.setattr(placement, "_gathered", lambda params: contextlib.nullcontext())
    return placement


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def test_the_replica_is_a_separate_whole_copy_refreshed_only_after_a_step(tiny_model_path, monkeypatch):
    from trl.trainer.utils import add_fused_lm_head

    policy = load_model(tiny_model_path)
    policy.model.embed_tokens.weight.requires_grad_(False)  # a frozen parameter stays frozen in the replica
    policy.activation_checkpointing_enable()  # and the policy's activation checkpointing is the replica's
    add_fused_lm_head(policy, temperature=0.7, outputs=("log_probs", "entropy"))  # as TRL's GRPOTrainer does
    placement = _placement(monkeypatch)
    engine = placement.accelerator.deepspeed_engine_wrapped.engine
    target = placement.open_batch(policy)
    replica = target.module
    trainable = [p for p in policy.parameters() if p.requires_grad]
    assert replica is not policy and type(replica) is type(policy)
    assert replica.is_activation_checkpointing
    assert len(target.params) == len(trainable) and torch.equal(_flat(target.params), _flat(trainable))
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(target.params, trainable, strict=True))
    assert replica.lm_head.weight is replica.model.embed_tokens.weight  # tied as in the policy
    assert placement.replica_bytes == 4 * sum(p.numel() for p in policy.parameters())  # FP32, reported at start-up
    ids = torch.tensor([[5, 9, 11, 7, 3]])
    labels = ids.clone()
    labels[:, :2] = -100
    with torch.no_grad():  # the fused head TRL patched into the policy is patched into the replica too
        want = policy(input_ids=ids, labels=labels, fused_lm_head=True).log_probs
        got = replica(input_ids=ids, labels=labels, fused_lm_head=True).log_probs
    assert torch.equal(got, want)

    with torch.no_grad():
        trainable[0].add_(1.0)  # the engine's θ moves only in its step: before it, the replica is not re-copied
    assert placement.publish_module(policy) is replica and not torch.equal(target.params[0], trainable[0])
    direction = torch.linspace(-1, 1, sum(p.numel() for p in trainable))
    placement.hand_over(direction, "optimizer step 0 (policy version 0)")
    placement.end_micro_step(False)
    assert engine.calls == []
    placement.end_micro_step(True)
    assert engine.calls == [("boundary", True), ("backward", False), ("step",)]
    assert torch.equal(_flat(p.grad for p in trainable), direction)  # the surrogate on the engine's parameters
    assert all(p.grad is None for p in target.params)  # the replica's are never the engine's
    published = placement.publish_module(policy)  # after the step: θ_{k+1}, gathered into the same replica
    assert published is replica and torch.equal(_flat(target.params), _flat(trainable))
