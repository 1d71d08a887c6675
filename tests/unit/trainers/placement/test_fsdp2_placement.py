"""The FSDP2 placement's local logic in one process: shard writing, the hook-free replica, the refusals.

`fully_shard` runs here over torch's fake process group (world size 2, this process being rank 0 or 1): it shards
parameters exactly as two real ranks would, and the code under test cuts its shards locally, with no communication
(the fake group would return garbage for a real collective, so a test passing here also shows none ran).
"""

from __future__ import annotations

import types
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from accelerate.utils import DistributedType
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

from trl_thundersync.errors import UnsupportedOptionError
from trl_thundersync.trainers.placement import check_engine
from trl_thundersync.trainers.placement.fsdp2 import (
    PlacementMemory,
    check_fsdp_args,
    paired_parameters,
    replica_of,
    write_sharded_grads,
)

pytestmark = pytest.mark.fast


@pytest.fixture(params=[0, 1], ids=["rank0", "rank1"])
def fake_rank(request):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=request.param, world_size=2, store=FakeStore())
    try:
        yield request.param
    finally:
        dist.destroy_process_group()


class TiedLM(torch.nn.Module):
    """Embedding and head sharing one weight, odd row counts (5 rows over 2 ranks: shards of 3 and 2; a 1-row
    bias: shards of 1 and 0), and a patched instance `forward` whose closure holds the original bound forward, as
    TRL's `add_fused_lm_head` leaves the policy."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.body = torch.nn.Linear(3, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.score = torch.nn.Linear(5, 1)
        self.head.weight = self.embed.weight
        self.body.bias.requires_grad_(False)
        original = self.forward

        def patched(self, ids, scale=1.0):
            assert original.__self__ is self  # the closure's forward is rebound with the module
            return original(ids) * scale

        self.forward = types.MethodType(patched, self)

    def forward(self, ids):
        return self.score(self.head(torch.tanh(self.body(self.embed(ids)))))


IDS = torch.tensor([[0, 3, 4, 1]])


def _sharded() -> tuple[TiedLM, dict[str, torch.Tensor], torch.Tensor]:
    """The sharded model, its unsharded weights by name and its output on IDS (scale 2) before sharding.

    One process that re-creates the fake group as another rank keeps the first device mesh's coordinate (torch
    caches the default mesh); the mesh is told the rank the group has, as a real rank's mesh knows it."""
    torch.manual_seed(0)
    model = TiedLM()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        expected = model(IDS, scale=2.0)
    fully_shard(model.body)
    fully_shard(model)
    for p in model.parameters():
        p.device_mesh._coordinate_on_dim = (dist.get_rank(),)
    return model, weights, expected


def test_the_direction_is_written_as_each_ranks_own_shard_with_the_parameters_placements(fake_rank):
    model, _, _ = _sharded()
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    direction = torch.arange(n, dtype=torch.float32)
    write_sharded_grads(direction, params)
    offset = 0
    for p in params:
        full = direction[offset:offset + p.numel()].view(p.shape)
        offset += p.numel()
        chunks = torch.chunk(full, 2, dim=0)
        expected = chunks[fake_rank] if fake_rank < len(chunks) else full[:0]
        assert p.grad.placements == p.placements and p.grad.shape == p.shape
        assert torch.equal(p.grad.to_local(), expected)
    assert model.body.bias.grad is None  # frozen: not in the direction


def test_a_direction_of_the_wrong_length_is_refused(fake_rank):
    model, _, _ = _sharded()
    params = [p for p in model.parameters() if p.requires_grad]
    with pytest.raises(Exception, match="trainable"):
        write_sharded_grads(torch.zeros(sum(p.numel() for p in params) + 1), params)


def test_the_replica_is_the_plain_module_tree_without_fsdp_hooks_and_computes_the_unsharded_forward(fake_rank):
    model, weights, expected = _sharded()
    replica = replica_of(model, torch.device("cpu"))
    assert not any(isinstance(m, FSDPModule) for m in replica.modules())
    assert type(replica) is TiedLM and type(replica.body) is torch.nn.Linear
    assert replica.head.weight is replica.embed.weight  # the tie survives
    assert not replica.body.bias.requires_grad and replica.body.weight.requires_grad
    pairs = paired_parameters(model, replica)
    assert [name for name, _ in model.named_parameters()] == [name for name, _ in replica.named_parameters()]
    with torch.no_grad():  # what refresh_replica's all-gather would bring: the unsharded weights
        for name, (_, full) in zip(weights, pairs, strict=True):
            full.copy_(weights[name])
    got = replica(IDS, scale=2.0)
    assert torch.equal(got, expected)
    params = [p for p in replica.parameters() if p.requires_grad]
    grads = torch.autograd.grad(got.sum(), params)  # local: the replica's parameters are plain tensors
    assert all(g is not None for g in grads)


def _accelerator(version=2, offload=None):
    plugin = SimpleNamespace(fsdp_version=version, cpu_offload=offload or OffloadPolicy())
    return SimpleNamespace(distributed_type=DistributedType.FSDP, state=SimpleNamespace(fsdp_plugin=plugin))


def test_fsdp2_is_accepted_and_fsdp1_and_cpu_offload_are_refused_by_name():
    check_engine(_accelerator())
    with pytest.raises(UnsupportedOptionError, match="fsdp_version=1"):
        check_engine(_accelerator(version=1))
    with pytest.raises(UnsupportedOptionError, match="cpu_offload"):
        check_engine(_accelerator(offload=CPUOffloadPolicy()))


def test_num_iterations_above_one_is_refused_by_name():
    args = SimpleNamespace(num_iterations=1, beta=0.04)
    check_fsdp_args(args)  # beta != 0 is covered: the reference runs on a replica too
    args.num_iterations = 2
    with pytest.raises(UnsupportedOptionError, match="FSDP2.*num_iterations=2"):
        check_fsdp_args(args)


def test_the_memory_bound_counts_the_replica_in_full_and_shards_over_the_ranks():
    memory = PlacementMemory(replica_bytes=400, world_size=4, trainable_bytes=40, trainable_params=10)
    assert memory.bound_bytes == 400 + (400 + 40) // 4
    assert "P=10" in memory.describe() and "4 ranks" in memory.describe()
