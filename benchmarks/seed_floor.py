"""Why ThunderSync's AdamW Δθ sits up to ~5× above the permuted-member floor: that floor keeps TRL's backward seeds.

    python -m benchmarks.seed_floor [--out outputs/seed_floor.json] [--threads N]

Stock TRL back-propagates row i from the per-token seed ∂loss/∂log π(o_it) = −fl(A_i · ν_i) (ν_i the loss
normalizer, e.g. 1/N for dapo); every FP32 rounding of the backward after it (the fused LM head, each activation
gradient, RMSNorm and SiLU backward) depends on that seed's mantissa. Permuting a group's members leaves each row's
forward *and* its seed bitwise unchanged, so the permuted floor measures only the order of the weight-gradient sums.
A streaming learner computes H_i = ∇ Σ_t u_i log π(o_it) before A_i and ν exist (seed u_i, not A_i·ν_i): its
backward rounds independently of TRL's, as accurately (the first table: distance of the step-1 batch direction to an
FP64 gradient of the same loss) but uncorrelated, and AdamW, which divides every coordinate by its own magnitude,
amplifies that
per-coordinate noise over three steps.

Columns of the second table (relative error of the parameter displacement after 3 steps against stock TRL,
‖Δθ − Δθ_trl‖ / ‖Δθ_trl‖):

    floor/perm    stock TRL with each group's members reversed / rotated (max): the issue's floor
    floor/seed    stock TRL with its loss × c and every gradient ÷ c (c = 3, 0.7; max): the same run in exact
                  arithmetic, only the backward's per-token rounding differs — the freedom a learner needs that
                  back-propagates before the advantage is known
    ts/reward     ThunderSync, reward release (scope: trajectory / group / batch, whichever the reward needs)
    ts/content    ThunderSync, content release (H_i before the reward)
    ts/trl-seeds  ThunderSync's pipeline with each trajectory's backward seeded by TRL's own per-token seeds, recorded
                  from the TRL run (an oracle, not streamable): back at floor/perm, which isolates the cause

The ts/trl-seeds row is a diagnostic that instruments internals on purpose (`trl_seeded_thundersync` swaps the
per-trajectory backward and the barrier's gradient write; TRL's side patches `_compute_loss`): no trainer should
offer a seam for replacing its seeds. Every other row runs the trainers through their public API.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import (
    load_model,
    relative_error,
    reward_batch_relative_length,
    reward_group_rank,
    reward_len,
    run_trainer,
)
from trl_thundersync.streaming import source as source_module
from trl_thundersync.tiny.model import save_tiny_model
from trl_thundersync.trainers.grpo.config import ThunderSyncGRPOConfig
from trl_thundersync.trainers.grpo.trainer import ThunderSyncGRPOTrainer
from trl_thundersync.trainers.placement import replicated as trainer_module  # where the barrier writes param.grad

SEED_SCALES = (3.0, 0.7)  # not powers of two: a power of two rescales every rounding exactly

# (name, reward, the reward_scope it needs, overrides): 2 groups of 4, 3 steps
CASES = (
    ("reward_len", reward_len, "trajectory", dict(max_grad_norm=0.5)),
    ("group_rank", reward_group_rank, "group", dict(max_grad_norm=0.5)),
    ("batch_relative_length", reward_batch_relative_length, "batch", dict(max_grad_norm=0.5)),
    ("batch_relative_length, scale_rewards=batch, no clip", reward_batch_relative_length, "batch",
     dict(scale_rewards="batch", max_grad_norm=0.0)),
)
OPTIMIZERS = (("sgd", 1e-2), ("adamw_torch", 1e-4))


class RescaledLossGRPOTrainer(GRPOTrainer):
    """Stock `trl.GRPOTrainer` whose loss is multiplied by `loss_scale` and every gradient divided by it again.

    In exact arithmetic this is TRL itself; in FP32 only the backward's per-token rounding changes (the seed of
    every row is `loss_scale` × TRL's). The division runs in a tensor hook, before accumulation into `.grad`.
    """

    loss_scale = 3.0

    def _compute_loss(self, model, inputs):
        if not hasattr(self, "_unscale_hooks"):
            scale = self.loss_scale
            self._unscale_hooks = [p.register_hook(lambda g: g / scale) for p in model.parameters()
                                   if p.requires_grad]
        return super()._compute_loss(model, inputs) * self.loss_scale


def rescaled_trainer(scale: float) -> type[RescaledLossGRPOTrainer]:
    return type(f"RescaledLossGRPOTrainer_{scale:g}", (RescaledLossGRPOTrainer,), {"loss_scale": scale})


def _row_key(step: int, prompt_ids, completion_ids) -> tuple:
    return step, tuple(int(t) for t in prompt_ids), tuple(int(t) for t in completion_ids)


@contextlib.contextmanager
def record_trl_seeds(seeds: dict) -> Iterator[None]:
    """While active, stock TRL's backward stores ∂loss/∂log π of every row, keyed by (step, prompt, completion)."""
    compute_loss, logps_fn = GRPOTrainer._compute_loss, GRPOTrainer._get_per_token_logps_and_entropies

    def _compute_loss(self, model, inputs):
        self._seed_rows = [
            _row_key(self.state.global_step, p[pm.bool()], c[cm.bool()])
            for p, pm, c, cm in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                                    inputs["completion_mask"], strict=True)
        ]
        try:
            return compute_loss(self, model, inputs)
        finally:
            del self._seed_rows

    def _logps(self, *args, **kwargs):
        out = logps_fn(self, *args, **kwargs)
        rows = getattr(self, "_seed_rows", None)
        if rows is not None and out[0].requires_grad:
            def keep(grad):
                for key, row in zip(rows, grad, strict=True):
                    seeds[key] = row[: len(key[2])].detach().clone()
            out[0].register_hook(keep)
        return out

    GRPOTrainer._compute_loss, GRPOTrainer._get_per_token_logps_and_entropies = _compute_loss, _logps
    try:
        yield
    finally:
        GRPOTrainer._compute_loss, GRPOTrainer._get_per_token_logps_and_entropies = compute_loss, logps_fn


@contextlib.contextmanager
def trl_seeded_thundersync(seeds: dict) -> Iterator[None]:
    """While active, ThunderSync's per-trajectory backward also runs from TRL's recorded seeds, and the barrier writes
    the sum of those gradients instead of its own direction (the pipeline, clipping and optimizer are unchanged)."""
    gradients, write = source_module.TrajectoryBackward.gradients, trainer_module.write_flat_grads
    state = {"sum": None, "step": 0}

    def _gradients(self, rollout, *, score):
        out = gradients(self, rollout, score=score)
        seed = seeds[_row_key(state["step"], rollout.prompt_ids, rollout.completion_ids)].unsqueeze(0)
        ids = torch.tensor([list(rollout.prompt_ids) + list(rollout.completion_ids)], device=self.device)
        logps = self.logps_fn(ids, torch.ones_like(ids), len(rollout.completion_ids))
        grads = torch.autograd.grad(logps, self.params, grad_outputs=seed.to(logps), allow_unused=True)
        flat = source_module.flatten_grads(grads, self.params)
        state["sum"] = flat if state["sum"] is None else state["sum"] + flat
        return out

    def _write(direction, params):
        write(state["sum"], params)
        state["sum"], state["step"] = None, state["step"] + 1

    source_module.TrajectoryBackward.gradients, trainer_module.write_flat_grads = _gradients, _write
    try:
        yield
    finally:
        source_module.TrajectoryBackward.gradients, trainer_module.write_flat_grads = gradients, write


def displacement_errors(work: Path, tokenizer, model_path: str, reward, scope: str, **config) -> dict[str, float]:
    """All columns of the module docstring for one reward and one config (3 steps, release="turn" not included)."""
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(model_path).parameters()])
    seeds: dict = {}

    def delta(trainer_cls, config_cls, name, **extra) -> torch.Tensor:
        with contextlib.redirect_stdout(io.StringIO()):  # the trainers' own log lines
            run = run_trainer(trainer_cls, config_cls, work / name, tokenizer, model_path, rewards=(reward,),
                              **config, **extra)
        return run.params - initial

    with record_trl_seeds(seeds):
        ref = delta(GRPOTrainer, GRPOConfig, "trl")

    def error(d: torch.Tensor) -> float:
        return relative_error(d, ref)

    out = {
        "floor/perm": max(error(delta(GRPOTrainer, GRPOConfig, o, member_order=o)) for o in ("reverse", "rotate")),
        "floor/seed": max(error(delta(rescaled_trainer(c), GRPOConfig, f"x{c:g}")) for c in SEED_SCALES),
    }
    for release in ("reward", "content"):
        out[f"ts/{release}"] = error(delta(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, f"ts-{release}",
                                           reward_scope=scope, release=release))
    with trl_seeded_thundersync(seeds):  # (every trajectory through the patched `gradients`: no group batches)
        out["ts/trl-seeds"] = error(delta(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, "ts-seeded",
                                          reward_scope=scope, release="reward", batch_group_members=False))
    return out


@contextlib.contextmanager
def _float64_norms_and_rope() -> Iterator[None]:
    """Qwen3's RMSNorm and rotary embedding compute in FP32 whatever the model dtype; in FP64 while active."""
    from transformers.models.qwen3 import modeling_qwen3 as qwen3

    def rms_norm(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rope(self, x, position_ids):
        dim = 2 * self.inv_freq.numel()
        inv_freq = 1.0 / (self.config.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64)
                                                                         / dim))
        freqs = position_ids[..., None].double() * inv_freq.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    saved = qwen3.Qwen3RMSNorm.forward, qwen3.Qwen3RotaryEmbedding.forward
    qwen3.Qwen3RMSNorm.forward, qwen3.Qwen3RotaryEmbedding.forward = rms_norm, rope
    try:
        yield
    finally:
        qwen3.Qwen3RMSNorm.forward, qwen3.Qwen3RotaryEmbedding.forward = saved


def step1_distance_to_fp64(work: Path, tokenizer, model_path: str) -> dict[str, float]:
    """‖d − g64‖ / ‖g64‖ of each run's first batch direction (reward_len, dapo, no clipping), g64 the FP64 gradient
    of TRL's loss on TRL's own first batch (its FP32 advantages and token count, so only the backward differs)."""
    config = dict(max_steps=1, optim="sgd", learning_rate=1e-2, num_generations=4, per_device_train_batch_size=8,
                  logging_steps=100, max_grad_norm=0.0)
    batches, compute_loss = [], GRPOTrainer._compute_loss

    def recording(self, model, inputs):
        batches.append({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)})
        return compute_loss(self, model, inputs)

    def direction(trainer_cls, config_cls, name, **extra) -> torch.Tensor:
        with contextlib.redirect_stdout(io.StringIO()):
            run = run_trainer(trainer_cls, config_cls, work / name, tokenizer, model_path, **config, **extra)
        return run.directions[0].double()

    GRPOTrainer._compute_loss = recording
    try:
        directions = {"trl": direction(GRPOTrainer, GRPOConfig, "trl")}
    finally:
        GRPOTrainer._compute_loss = compute_loss
    directions["trl, members reversed"] = direction(GRPOTrainer, GRPOConfig, "rev", member_order="reverse")
    directions["trl, loss x 3"] = direction(rescaled_trainer(3.0), GRPOConfig, "x3")
    for release in ("reward", "content"):
        directions[f"thundersync, release={release}"] = direction(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig,
                                                                  f"ts-{release}", release=release)
    batch = batches[0]
    model = load_model(model_path, dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    exact = torch.zeros_like(directions["trl"])
    with _float64_norms_and_rope():
        for i in range(batch["prompt_ids"].size(0)):
            prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()]
            completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()]
            logits = model(input_ids=torch.cat([prompt, completion]).unsqueeze(0)).logits[0, len(prompt) - 1:-1]
            logps = torch.log_softmax(logits, -1).gather(-1, completion.unsqueeze(-1)).sum()
            weight = -float(batch["advantages"][i]) / float(batch["num_items_in_batch"])
            exact += torch.cat([g.reshape(-1) for g in torch.autograd.grad(weight * logps, params)])
    return {name: relative_error(d, exact) for name, d in directions.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/seed_floor.json")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (the tests use 1)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    work = Path(tempfile.mkdtemp(prefix="ts-seed-floor-"))
    model_path = str(save_tiny_model(work / "tiny"))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    print("step-1 batch direction (reward_len, dapo), distance to the FP64 gradient of the same loss")
    distances = step1_distance_to_fp64(work / "fp64", tokenizer, model_path)
    for name, value in distances.items():
        print(f"  {name:<34} {value:.2e}")
    print()
    columns = ("floor/perm", "floor/seed", "ts/reward", "ts/content", "ts/trl-seeds")
    print(f"{'reward (3 steps), rel. error of Δθ':<52} {'optim':<6}" + "".join(f" {c:>12}" for c in columns))
    rows = []
    for optim, lr in OPTIMIZERS:
        for name, reward, scope, overrides in CASES:
            config = dict(overrides, max_steps=3, optim=optim, learning_rate=lr, num_generations=4,
                          per_device_train_batch_size=8, logging_steps=100)
            errors = displacement_errors(work / optim / str(len(rows)), tokenizer, model_path, reward, scope,
                                         **config)
            rows.append({"reward": name, "optim": optim, "reward_scope": scope, "overrides": overrides, **errors})
            print(f"{name[:52]:<52} {optim[:6]:<6}" + "".join(f" {errors[c]:>12.2e}" for c in columns), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"step1_distance_to_fp64": distances, "displacement": rows}, indent=2))


if __name__ == "__main__":
    main()
