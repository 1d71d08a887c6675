"""The DeepSpeed placement's logic with a fake engine: when the direction reaches the engine, in what form, and what
is refused (the real engine on two CPU processes: tests/integration/test_deepspeed.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType

from trl_thundersync.errors import NonFiniteGradientError, UnsupportedOptionError
from trl_thundersync.trainers.placement import check_engine, unplaced_policy
from trl_thundersync.trainers.placement.deepspeed import DeepSpeedPlacement, check_deepspeed, surrogate

pytestmark = pytest.mark.fast


class _Engine:
    """Records what the placement asks of a DeepSpeed engine; its backward is a plain autograd backward."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def set_gradient_accumulation_boundary(self, is_boundary):
        self.calls.append(("boundary", is_boundary))

    def backward(self, loss, scale_wrt_gas=True):
        self.calls.append(("backward", scale_wrt_gas))
        loss.backward()

    def step(self):
        self.calls.append(("step",))


class _Accelerator:
    def __init__(self, stage: int = 2, processes: int = 1, bad_elsewhere: float = 0.0, **zero):
        config = {"zero_optimization": {"stage": stage, **zero}}
        self.state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=config))
        self.distributed_type = DistributedType.DEEPSPEED
        self.num_processes, self.bad_elsewhere = processes, bad_elsewhere
        self.deepspeed_engine_wrapped = SimpleNamespace(engine=_Engine())
        self.reduced: list[torch.Tensor] = []

    def unwrap_model(self, model):
        return model.module if hasattr(model, "module") else model

    def reduce(self, tensor, reduction):
        assert reduction == "sum"
        self.reduced.append(tensor)
        return tensor + self.bad_elsewhere  # the other process's flag


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[0].bias.requires_grad_(False)
    return model


def _size(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_the_surrogate_gradient_is_the_direction_in_parameter_order():
    model = _model()
    params = [p for p in model.parameters() if p.requires_grad]
    direction = torch.arange(_size(model), dtype=torch.float32)
    grads = torch.autograd.grad(surrogate(params, direction), params)
    assert torch.equal(torch.cat([g.reshape(-1) for g in grads]), direction)
    with pytest.raises(ValueError, match="direction has 3 entries"):
        surrogate(params, torch.zeros(3))


def test_the_direction_reaches_the_engine_once_at_the_window_boundary_unscaled():
    model = _model()
    accelerator = _Accelerator(stage=2, processes=2)
    engine = accelerator.deepspeed_engine_wrapped.engine
    placement = DeepSpeedPlacement(accelerator)
    assert placement.name == "DeepSpeed ZeRO-2"
    target = placement.open_batch(SimpleNamespace(module=model))
    assert target.module is model and len(target.params) == 3  # the frozen bias is not a target
    direction = torch.linspace(-1, 1, _size(model))
    placement.hand_over(direction, "optimizer step 0 (policy version 0)")
    assert all(p.grad is None for p in target.params)  # nothing reaches the engine at the barrier
    placement.end_micro_step(False)  # an earlier micro-step of the accumulation window
    assert engine.calls == []
    placement.end_micro_step(True)
    assert engine.calls == [("boundary", True), ("backward", False), ("step",)]
    assert torch.equal(torch.cat([p.grad.reshape(-1) for p in target.params]), direction)
    with pytest.raises(RuntimeError, match="without a batch direction"):  # handed over once per window
        placement.end_micro_step(True)


def test_a_non_finite_share_on_any_process_is_refused_on_every_process():
    model = _model()
    n = _size(model)
    bad = torch.zeros(n)
    bad[2] = float("inf")
    placement = DeepSpeedPlacement(_Accelerator(processes=2))
    placement.open_batch(model)
    with pytest.raises(NonFiniteGradientError, match="optimizer step 4.*1 process"):
        placement.hand_over(bad, "optimizer step 4 (policy version 4)")
    # this process's share is finite, the other process flagged its own: refused here too, before the engine
    accelerator = _Accelerator(processes=2, bad_elsewhere=1.0)
    placement = DeepSpeedPlacement(accelerator)
    placement.open_batch(model)
    with pytest.raises(NonFiniteGradientError, match="optimizer step 5"):
        placement.hand_over(torch.zeros(n), "optimizer step 5 (policy version 5)")
    assert accelerator.deepspeed_engine_wrapped.engine.calls == []


@pytest.mark.parametrize(("zero", "args", "needle"), [
    (dict(stage=4), None, "ZeRO-4: zero_optimization.stage must be 1, 2 or 3"),
    (dict(stage=0), None, "ZeRO-0: zero_optimization.stage=0 is DeepSpeed's plain data parallelism"),
    (dict(stage=3), SimpleNamespace(beta=0.1, num_iterations=1), "ZeRO-3: beta=0.1"),
    (dict(stage=2, offload_optimizer={"device": "cpu"}), None, "zero_optimization.offload_optimizer.device='cpu'"),
    (dict(stage=1, offload_param={"device": "nvme"}), None, "zero_optimization.offload_param.device='nvme'"),
    (dict(stage=2), SimpleNamespace(num_iterations=2), "ZeRO-2: num_iterations=2"),
])
def test_setups_the_placement_does_not_cover_are_refused_by_stage_and_field(zero, args, needle):
    accelerator = _Accelerator(**zero)
    with pytest.raises(UnsupportedOptionError, match=needle.replace("(", r"\(")):
        check_engine(accelerator, args)


def test_covered_setups_pass_the_check():
    for stage in (1, 2, 3):
        check_engine(_Accelerator(stage=stage, offload_optimizer={"device": "none"}), SimpleNamespace(num_iterations=1))
    accelerator = _Accelerator(stage=2)
    accelerator.state.deepspeed_plugin.deepspeed_config["managed_gradient_accumulation"] = False
    with pytest.raises(UnsupportedOptionError, match="managed_gradient_accumulation=false"):
        check_deepspeed(accelerator)


def _gkd_args(**fields):
    from trl_thundersync.trainers.gkd.config import ThunderSyncGKDConfig

    args = ThunderSyncGKDConfig.__new__(ThunderSyncGKDConfig)  # only the fields the checks read
    args.__dict__.update(dict(teacher_server_url="http://127.0.0.1:1", lmbda=1.0, seq_kd=False, beta=0.5,
                              num_iterations=1, gradient_accumulation_steps=1), **fields)
    return args


def test_gkd_passes_every_stage_and_fsdp2_with_a_served_or_local_teacher_and_off_policy_steps():
    from trl_thundersync.trainers.placement.fsdp2 import check_fsdp_args

    for fields in (dict(), dict(teacher_server_url=None), dict(lmbda=0.5), dict(seq_kd=True)):
        for stage in (1, 2, 3):
            check_deepspeed(_Accelerator(stage=stage), _gkd_args(**fields))
        check_fsdp_args(_gkd_args(**fields))


def test_gkd_mixed_accumulation_windows_are_refused_by_engine_and_field():
    from trl_thundersync.trainers.placement.fsdp2 import check_fsdp_args

    fields = dict(lmbda=0.5, gradient_accumulation_steps=2)
    for stage in (1, 2, 3):
        with pytest.raises(UnsupportedOptionError, match=f"DeepSpeed ZeRO-{stage}: ThunderSyncGKDTrainer with "
                                                         "lmbda=0.5 and gradient_accumulation_steps=2"):
            check_deepspeed(_Accelerator(stage=stage), _gkd_args(**fields))
    with pytest.raises(UnsupportedOptionError, match=r"FSDP2 \(fully_shard\): .*gradient_accumulation_steps=2"):
        check_fsdp_args(_gkd_args(**fields))


def test_a_policy_partitioned_before_train_is_refused_as_a_rollout_source():
    model = _model()
    accelerator = _Accelerator(stage=3)
    assert unplaced_policy(accelerator, model) is model  # whole parameters: the policy itself
    model[1].weight.ds_id = 7  # what ZeRO-3's zero.Init leaves on a partitioned parameter
    with pytest.raises(UnsupportedOptionError, match="ZeRO-3: the policy's parameters are partitioned before train"):
        unplaced_policy(accelerator, model)
