"""The learner placement seam: the replicated placement (one process, DDP) and the refusal of other engines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType

from trl_thundersync.errors import NonFiniteGradientError
from trl_thundersync.trainers.placement.replicated import ReplicatedPlacement

pytestmark = pytest.mark.fast


class _Accelerator:
    def __init__(self, processes: int = 1, reduced: torch.Tensor | None = None):
        self.num_processes, self.reduced, self.distributed_type = processes, reduced, DistributedType.NO

    def unwrap_model(self, model):
        return model.module if hasattr(model, "module") else model

    def reduce(self, tensor, reduction):
        assert reduction == "mean"
        return self.reduced


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[0].bias.requires_grad_(False)
    return model


def test_replicated_placement_differentiates_the_unwrapped_trainable_parameters_and_writes_the_direction():
    model = _model()
    placement = ReplicatedPlacement(_Accelerator())
    target = placement.open_batch(SimpleNamespace(module=model))
    assert target.module is model and [id(p) for p in target.params] == [
        id(p) for p in model.parameters() if p.requires_grad]
    direction = torch.arange(sum(p.numel() for p in target.params), dtype=torch.float32)
    placement.hand_over(direction, "optimizer step 0 (policy version 0)")
    written = torch.cat([p.grad.reshape(-1) for p in target.params])
    assert torch.equal(written, direction) and model[0].bias.grad is None
    placement.end_micro_step(True)  # nothing more to do: the direction stays in param.grad
    assert torch.equal(torch.cat([p.grad.reshape(-1) for p in target.params]), direction)


def test_with_several_processes_the_mean_over_processes_is_written():
    model = _model()
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    mean = torch.full((n,), 0.25)
    placement = ReplicatedPlacement(_Accelerator(processes=2, reduced=mean))
    assert placement.name == "DDP"
    target = placement.open_batch(model)
    placement.hand_over(torch.ones(n), "step")
    assert torch.equal(torch.cat([p.grad.reshape(-1) for p in target.params]), mean)


def test_a_non_finite_reduced_direction_is_refused_before_any_gradient_is_written():
    model = _model()
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    bad = torch.zeros(n)
    bad[1] = float("nan")
    placement = ReplicatedPlacement(_Accelerator(processes=2, reduced=bad))
    target = placement.open_batch(model)
    with pytest.raises(NonFiniteGradientError, match="optimizer step 4"):
        placement.hand_over(torch.zeros(n), "optimizer step 4 (policy version 4)")
    assert all(p.grad is None for p in target.params)


@pytest.mark.parametrize(("variable", "kind"), [("ACCELERATE_USE_FSDP", DistributedType.MULTI_GPU),
                                                ("ACCELERATE_USE_DEEPSPEED", DistributedType.NO)])
def test_an_engine_the_launcher_asked_for_but_accelerate_did_not_set_up_is_refused(variable, kind):
    from trl_thundersync.errors import UnsupportedOptionError
    from trl_thundersync.trainers.placement import refuse_silent_fallback

    with pytest.raises(UnsupportedOptionError, match=f"{variable}=true asks for"):
        refuse_silent_fallback(kind, 1, {variable: "true"})
    refuse_silent_fallback(kind, 1, {variable: "false"})  # not asked for: nothing to refuse
    wanted = DistributedType.FSDP if variable == "ACCELERATE_USE_FSDP" else DistributedType.DEEPSPEED
    refuse_silent_fallback(wanted, 2, {variable: "true"})  # set up as asked
