"""FSDP2 sharded learner: unsharded local accumulation (a) vs lock-step rounds (b), measured on 2 CPU processes.

    python -m benchmarks.sharded_design [--steps 3] [--time-scale 4] [--out outputs/sharded_design.json]

Both designs take the same optimizer steps on the same FSDP2 model (fully_shard per decoder layer, gloo) from the
same synthetic schedule: every rank has its own sources (token sequences) that become ready at their own times
(unequal counts, lengths and ready times per rank, with a tail on rank 1), and each source's weighted loss gradient
goes into one batch direction.
- (a) `local` — the product (`trainers/placement/fsdp2.py`): at the step start every rank gathers θ_k once into a
  replica, runs each source's pass locally as soon as it is ready (no collective), and at the barrier one all-reduce
  averages the directions, written as shards into `.grad`;
- (b) `lockstep` — every rank runs, per round, its next source (waiting until it is ready) or a zero-weight no-op
  through the sharded module: each pass all-gathers the weights and reduce-scatters the gradient.

Each design runs in its own 2-process launch (its peak RSS is its own). Per rank: step wall time, busy time (its
own sources' passes), time blocked in collectives waiting for the other rank (the barrier in (a), the round
synchronisation in (b)), no-op passes, tensor bytes (parameters, shards, accumulators) and peak RSS over the
baseline. The final parameters of both designs are compared (the same update, FP32). Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

# Per rank: (ready time in seconds after the step start, tokens) of each source; rank 1 has fewer, later sources.
SCHEDULE = {
    0: [(0.02, 24), (0.06, 40), (0.10, 16), (0.15, 48), (0.20, 32), (0.26, 24), (0.32, 40), (0.40, 16)],
    1: [(0.10, 48), (0.35, 16), (0.60, 40), (0.90, 24)],
}
VOCAB = 2048


def _model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, vocab_size=VOCAB, tie_word_embeddings=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _shard(model: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def _source(rank: int, step: int, j: int, tokens: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + 100 * rank + j)
    return torch.randint(0, VOCAB, (1, tokens), generator=generator)


def _loss(module: torch.nn.Module, ids: torch.Tensor, weight: float) -> torch.Tensor:
    logits = module(input_ids=ids).logits[0, :-1]
    return weight * torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum") / ids.shape[1]


TIME_SCALE = float(os.environ.get("SHARDED_DESIGN_TIME_SCALE", "1"))  # set by --time-scale for the workers


def _wait_until(start: float, ready: float) -> None:
    delay = start + ready * TIME_SCALE - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


class Clock:
    """Per-rank time accounting of one design."""

    def __init__(self) -> None:
        self.busy = self.blocked = self.noop = self.wall = 0.0
        self.noops = 0

    def as_dict(self, steps: int) -> dict:
        return {"step_s": self.wall / steps, "busy_s": self.busy / steps, "blocked_s": self.blocked / steps,
                "noop_s": self.noop / steps, "noop_passes": self.noops / steps,
                "idle_fraction": 1 - self.busy / self.wall}


def _local_step(model, placement_state, step: int, rank: int, clock: Clock) -> None:
    from trl_thundersync.trainers.placement.fsdp2 import refresh_replica, write_sharded_grads

    replica, pairs = placement_state
    start = time.perf_counter()
    refresh_replica(pairs)  # θ_k gathered once, every rank together
    params = [full for _, full in pairs]
    acc = torch.zeros(sum(p.numel() for p in params))
    for j, (ready, tokens) in enumerate(SCHEDULE[rank]):
        _wait_until(start, ready)
        t0 = time.perf_counter()
        grads = torch.autograd.grad(_loss(replica, _source(rank, step, j, tokens), 1.0), params)
        acc.add_(torch.cat([g.reshape(-1) for g in grads]))
        clock.busy += time.perf_counter() - t0
    t0 = time.perf_counter()
    dist.all_reduce(acc)  # waits for the slowest rank's last source, then reduces
    clock.blocked += time.perf_counter() - t0
    write_sharded_grads(acc / dist.get_world_size(), [p for p, _ in pairs])
    clock.wall += time.perf_counter() - start


def _lockstep_step(model, step: int, rank: int, clock: Clock) -> None:
    start = time.perf_counter()
    rounds = max(len(s) for s in SCHEDULE.values())
    flag = torch.zeros(1)
    for j in range(rounds):
        mine = SCHEDULE[rank][j] if j < len(SCHEDULE[rank]) else None
        if mine is not None:
            _wait_until(start, mine[0])
        t0 = time.perf_counter()
        dist.all_reduce(flag)  # the round starts when every rank has its source (or none) at hand
        clock.blocked += time.perf_counter() - t0
        t0 = time.perf_counter()
        if mine is None:  # a zero-weight no-op: the collectives of the pass still have to be entered
            _loss(model, torch.zeros(1, 2, dtype=torch.long), 0.0).backward()
            clock.noop += time.perf_counter() - t0
            clock.noops += 1
        else:
            _loss(model, _source(rank, step, j, mine[1]), 1.0).backward()  # FSDP2 averages over ranks
            clock.busy += time.perf_counter() - t0
    clock.wall += time.perf_counter() - start


def worker(design: str, steps: int, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = _shard(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    total = sum(p.numel() for p in model.parameters())
    world = dist.get_world_size()
    placement_state = None
    if design == "local":
        from trl_thundersync.trainers.placement.fsdp2 import paired_parameters, replica_of

        replica = replica_of(model, torch.device("cpu"))
        placement_state = (replica, paired_parameters(model, replica))
    clock = Clock()
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()
        if design == "local":
            _local_step(model, placement_state, step, rank, clock)
        else:
            _lockstep_step(model, step, rank, clock)
        optimizer.step()
    final = torch.cat([p.detach().full_tensor().reshape(-1) for p in model.parameters()])
    shard_bytes = 4 * -(-total // world)
    tensors = {"params_shard": shard_bytes, "grad_shard": shard_bytes,
               "replica": 4 * total if design == "local" else 0,
               "accumulator": 4 * total if design == "local" else 0}
    row = {"rank": rank, **clock.as_dict(steps), "tensor_bytes": tensors,
           "tensor_total_mib": sum(tensors.values()) / 2**20,
           "peak_rss_over_baseline_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline_kib) / 1024}
    rows = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        torch.save({"rows": rows, "params": final, "num_params": total}, out / f"{design}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(design: str, steps: int, folder: Path, time_scale: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]),
               SHARDED_DESIGN_TIME_SCALE=str(time_scale))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "benchmarks.sharded_design", "--worker", design,
           "--steps", str(steps), "--folder", str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{design} failed:\n{done.stderr[-3000:]}")
    return torch.load(folder / f"{design}.pt", weights_only=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=4.0,
                        help="multiplies every ready time of SCHEDULE (1: compute-bound on 2 shared cores)")
    parser.add_argument("--out", default="outputs/sharded_design.json")
    parser.add_argument("--worker", choices=["local", "lockstep"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.steps, Path(args.folder))
    with tempfile.TemporaryDirectory() as tmp:
        results = {design: _launch(design, args.steps, Path(tmp), args.time_scale) for design in ("local", "lockstep")}
    a, b = results["local"]["params"], results["lockstep"]["params"]
    difference = float((a - b).norm() / b.norm())  # the same update either way (FP32 rounding)
    print(f"{results['local']['num_params']} parameters, 2 ranks, {args.steps} steps; schedule (ready s × "
          f"{args.time_scale}, tokens): {SCHEDULE}")
    print(f"{'design':9} {'rank':>4} {'step s':>7} {'busy s':>7} {'blocked s':>9} {'no-op s':>8} {'no-ops':>6} "
          f"{'idle':>5} {'tensors MiB':>11} {'RSS+ MiB':>8}")
    for design, result in results.items():
        for r in result["rows"]:
            print(f"{design:9} {r['rank']:>4} {r['step_s']:7.3f} {r['busy_s']:7.3f} {r['blocked_s']:9.3f} "
                  f"{r['noop_s']:8.3f} {r['noop_passes']:6.1f} {r['idle_fraction']:5.2f} "
                  f"{r['tensor_total_mib']:11.1f} {r['peak_rss_over_baseline_mib']:8.1f}")
    print(f"final parameters, local vs lockstep: relative difference {difference:.2e}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "time_scale": args.time_scale, "schedule": SCHEDULE,
                               "num_params": results["local"]["num_params"],
                               "rows": {d: r["rows"] for d, r in results.items()},
                               "final_params_relative_difference": difference}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
