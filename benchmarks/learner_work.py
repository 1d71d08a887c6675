"""Learner work of one GRPO group with and without the shared-prefix backward (`streaming/shared_prefix.py`).

For each prompt length and group size, the same group (one random prompt, members with continuations of different
lengths around `--completion`) is learned twice at the same θ, side by side in one process:

    full:    every member forwarded and back-propagated over prompt + completion; H_i folded by `GroupStatistics`
    shared:  the prompt forwarded once, each member's continuation over its detached key/values, boundary adjoints
             folded by the same algebra (`PrefixAdjoints`), one backward through the prompt at group close

Learner FLOPs come from the ledger's accounting (`streaming.flops`, via `shared_prefix.pass_flops` over the passes that
actually ran); wall time is the median of `--repeats` runs of each variant, interleaved, after one untimed warm-up
run each (the ratio of the fastest runs is printed too: on a loaded machine it is the less disturbed estimate). The
relative error of the two group directions is printed as a check that both computed the same update. Prints a
table, writes JSON.

    python -m benchmarks.learner_work                 # prompts 64/512/2048 × groups 4/8/16 (under a minute on 2 cores)
    python -m benchmarks.learner_work --quick         # prompts 64/512 × groups 4/8, one repeat
    python -m benchmarks.learner_work --learner --prompts 800 --groups 8 --completion 130   # the main job's shape

`--learner` runs the variants through the wired GRPO learner instead (`GRPOBatchLearner` + `TrajectoryBackward`,
reward release, `shared_prefix` on or off), so the per-member bookkeeping the trainer pays is in the wall time and
the FLOPs are the ledger's (`trace.recorder.learner_events`) as `thundersync/learner_tflops_per_s` counts them; it adds
two more variants: `batched`, the shared prefix with the group's members handed over together (`submit_ready`), learned
as one padded pass over the prefix with their advantages folded in (`prefix_batch.py`); and `full_batched`, the same
without the prefix, one padded pass of full sequences (`source_batch.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

import torch

from trl_thundersync.streaming.accumulators import GroupStatistics
from trl_thundersync.streaming.flops import ModelShape, model_flop_counter
from trl_thundersync.streaming.gradient_sinks import FlatGradient
from trl_thundersync.streaming.learner import GRPOBatchLearner
from trl_thundersync.streaming.normalization import LossNormalization
from trl_thundersync.streaming.prefix_groups import PrefixGroups
from trl_thundersync.streaming.segment_backward import model_logits
from trl_thundersync.streaming.shared_prefix import (
    GroupPrefix,
    PrefixAdjoints,
    full_pass_work,
    pass_flop_counter,
    pass_flops,
    prompt_plan,
)
from trl_thundersync.streaming.source import TrajectoryBackward
from trl_thundersync.streaming.source_batch import group_batch
from trl_thundersync.tiny.model import build_tiny_tokenizer, model_from_config, tiny_shape
from trl_thundersync.trace.recorder import learner_events
from trl_thundersync.types import Rollout, ScoredRollout

EPS = 1e-4


def _model(hidden: int, layers: int, window: int):
    from transformers import Qwen3Config

    tokenizer = build_tiny_tokenizer()
    config = Qwen3Config(**{**tiny_shape(tokenizer, hidden, layers), "max_position_embeddings": window})
    return model_from_config(config, tokenizer, seed=0)


def _objective(logits: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """GRPO's score channel without its advantage: Σ_t log π(o_t) / |o| (the grpo loss type's token weights)."""
    logps = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None])[:, 0]
    return {"score": logps.sum() / len(tokens)}


def _group(vocab: int, prompt: int, size: int, completion: int, seed: int) -> tuple[list[list[int]], list[float]]:
    gen = torch.Generator().manual_seed(seed)
    head = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
    lengths = [max(1, completion + (i % 5 - 2) * max(1, completion // 8)) for i in range(size)]
    members = [head + torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    rewards = torch.rand(size, generator=gen).tolist()
    return members, rewards


def _fold(grads: GroupStatistics) -> torch.Tensor:
    return grads.fold(1.0 / (grads.std + EPS))[0]


def run_full(model, params, members, rewards, prompt: int) -> torch.Tensor:
    grads = GroupStatistics(0, len(members), sum(p.numel() for p in params))
    for ids, reward in zip(members, rewards, strict=True):
        sink = FlatGradient(params)
        logits = model_logits(model, ids, torch.device("cpu"), keep=len(ids) - prompt + 1)[:-1]
        loss = _objective(logits, torch.tensor(ids[prompt:]))["score"]
        sink.add(torch.autograd.grad(loss, params, allow_unused=True), "full pass")
        grads.add(reward, sink.vector)
    return _fold(grads)


def run_shared(model, params, members, rewards, prompt: int) -> tuple[torch.Tensor, GroupPrefix]:
    prefix = GroupPrefix(model, params, prompt_plan(0, members[0][:prompt]))
    grads = GroupStatistics(0, len(members), sum(p.numel() for p in params))
    adjoints = PrefixAdjoints(0, len(members), prefix.adjoint_size)
    for i, (ids, reward) in enumerate(zip(members, rewards, strict=True)):
        sink = FlatGradient(params)
        out = prefix.member(i, ids, _objective, {"score": sink})
        grads.add(reward, sink.vector)
        adjoints.add(reward, out.adjoints["score"])
    through_prefix = FlatGradient(params)
    prefix.backward(adjoints.fold(1.0 / (grads.std + EPS)), {("score", 0): through_prefix})
    return _fold(grads) + through_prefix.vector, prefix


def _logps_fn(model):
    """Per-token log π of the last `keep` tokens, as TRL's forward computes them (temperature 1)."""
    def logps(ids, mask, keep):
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep + 1).logits[:, :-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -keep:, None])[..., 0]
    return logps


def run_learner(model, params, members, rewards, prompt: int, shared: bool, batched: bool = False):
    """One group through the wired learner at reward release (`batched`: its members handed over together, so they
    run as one padded pass over the prefix, `prefix_batch.py`); returns its direction, work items and passes."""
    norm = LossNormalization("grpo", len(members), 1, max(len(ids) for ids in members))
    prefixes = None
    if shared:
        prefixes = PrefixGroups(model=model, params=params, group_size=len(members), max_open=1,
                                flops=pass_flop_counter(model, params))
    backward = TrajectoryBackward(params=params, logps_fn=_logps_fn(model), normalization=norm, eos_and_pad=(-1,),
                                  mask_truncated=False, prefixes=prefixes)
    learner = GRPOBatchLearner(batch_size=len(members), num_generations=len(members),
                               num_params=sum(p.numel() for p in params), policy_version=0, scale_rewards="group",
                               source_backward=backward, eps=EPS, prefixes=prefixes,
                               group_backward=partial(group_batch, backward) if batched else None)
    sources = [ScoredRollout(Rollout(index=i, group=0, policy_version=0, prompt_ids=tuple(ids[:prompt]),
                                     completion_ids=tuple(ids[prompt:])), (reward,), reward, time.perf_counter())
               for i, (ids, reward) in enumerate(zip(members, rewards, strict=True))]
    if batched:
        learner.submit_ready(sources)
    for source in sources if not batched else ():
        learner.submit(source)
    totals = learner.finish()
    work = prefixes.closed_work if shared else full_pass_work([len(ids) for ids in members])
    return totals.accumulator.policy[0], totals.work, work


def _timed(runs: dict, repeats: int) -> tuple[dict, dict[str, list[float]]]:
    """Each variant once untimed (allocator, kernels at these shapes), then `repeats` interleaved timed runs, so
    machine noise hits both; the last result of each."""
    walls: dict[str, list[float]] = {name: [] for name in runs}
    results = {name: run() for name, run in runs.items()}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            results[name] = run()
            walls[name].append(time.perf_counter() - start)
    return results, walls


def measure_point(model, prompt: int, size: int, completion: int, repeats: int, learner: bool = False) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    shape = ModelShape.from_config(model.config)
    members, rewards = _group(model.config.vocab_size, prompt, size, completion, seed=prompt * 100 + size)
    row = {"prompt": prompt, "group": size, "completion_tokens": sum(len(ids) - prompt for ids in members)}
    variants = ("full", "shared")
    if learner:
        variants = ("full", "shared", "batched", "full_batched")
        flags = {"full": (False, False), "shared": (True, False), "batched": (True, True),
                 "full_batched": (False, True)}  # (shared prefix, members handed over together)
        results, walls = _timed({name: lambda f=flags[name]: run_learner(model, params, members, rewards, prompt, *f)
                                 for name in variants}, repeats)
        context = {i: len(ids) for i, ids in enumerate(members)}
        flops_of = model_flop_counter(model, params)
        ledger = {name: sum(e.flops for e in learner_events(results[name][1], context, flops_of))
                  for name in variants}
        works = {name: results[name][2] for name in variants}
        directions = {name: results[name][0] for name in variants}
    else:
        results, walls = _timed({"full": lambda: run_full(model, params, members, rewards, prompt),
                                 "shared": lambda: run_shared(model, params, members, rewards, prompt)}, repeats)
        full, (shared, prefix) = results["full"], results["shared"]
        works = {"full": full_pass_work([len(ids) for ids in members]), "shared": prefix.work}
        ledger = {name: sum(pass_flops(shape, w) for w in work) for name, work in works.items()}
        directions = {"full": full, "shared": shared}
    for name in variants:
        row[name] = {"token_passes": sum(w.tokens for w in works[name]), "flops": ledger[name],
                     "wall_seconds": statistics.median(walls[name]), "wall_runs": walls[name],
                     "relative_error": float((directions[name] - directions["full"]).norm()
                                             / directions["full"].norm())}
    row["flop_ratio"] = row["shared"]["flops"] / row["full"]["flops"]
    row["wall_ratio"] = row["shared"]["wall_seconds"] / row["full"]["wall_seconds"]
    row["fastest_wall_ratio"] = min(walls["shared"]) / min(walls["full"])  # least disturbed runs (a loaded machine)
    row["relative_error"] = max(row[name]["relative_error"] for name in variants)
    if "batched" in row:
        row["batched_flop_ratio"] = row["batched"]["flops"] / row["full"]["flops"]
        row["batched_wall_ratio"] = row["batched"]["wall_seconds"] / row["full"]["wall_seconds"]
        row["full_batched_wall_ratio"] = row["full_batched"]["wall_seconds"] / row["full"]["wall_seconds"]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 512, 2048], help="prompt lengths (tokens)")
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 8, 16], help="group sizes")
    parser.add_argument("--completion", type=int, default=64, help="mean completion tokens per member")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: comparable under load)")
    parser.add_argument("--quick", action="store_true", help="prompts 64/512, groups 4/8, one repeat")
    parser.add_argument("--learner", action="store_true",
                        help="the variants through the wired GRPO learner (shared_prefix on / off, members batched)")
    parser.add_argument("--out", default="learner_work.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.groups, args.repeats = [p for p in args.prompts if p <= 512], [4, 8], 1
    torch.set_num_threads(args.threads)
    model = _model(args.hidden, args.layers, window=max(args.prompts) + 2 * args.completion + 8)
    rows = [measure_point(model, p, g, args.completion, args.repeats, args.learner)
            for p in args.prompts for g in args.groups]
    print(f"tiny Qwen3 ({args.hidden} wide, {args.layers} layers, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters), ~{args.completion} completion tokens per member, median of {args.repeats}, "
          f"{args.threads} thread(s)" + (", through the GRPO learner" if args.learner else ""))
    print(f"{'prompt':>6}{'G':>4}{'tokens full':>13}{'shared':>8}{'GFLOP full':>12}{'shared':>9}{'ratio':>7}"
          f"{'wall s full':>13}{'shared':>9}{'ratio':>7}{'(fastest)':>10}{'rel. error':>12}")
    for r in rows:
        full, shared = r["full"], r["shared"]
        print(f"{r['prompt']:>6}{r['group']:>4}{full['token_passes']:>13}{shared['token_passes']:>8}"
              f"{full['flops'] / 1e9:>12.3f}{shared['flops'] / 1e9:>9.3f}{r['flop_ratio']:>7.3f}"
              f"{full['wall_seconds']:>13.3f}{shared['wall_seconds']:>9.3f}{r['wall_ratio']:>7.3f}"
              f"{r['fastest_wall_ratio']:>10.3f}"
              f"{r['relative_error']:>12.1e}")
    if args.learner:  # the same groups, their members handed over together: one padded pass over the prefix
        print(f"\nmembers ready together (`submit_ready`): one padded pass per group over its prefix (batched), or of "
              f"full sequences (full_batched)\n"
              f"{'prompt':>6}{'G':>4}{'GFLOP batched':>15}{'ratio':>7}{'wall s batched':>16}{'ratio':>7}"
              f"{'vs shared':>11}{'wall s full_batched':>21}{'vs full':>9}")
        for r in rows:
            b, fb = r["batched"], r["full_batched"]
            print(f"{r['prompt']:>6}{r['group']:>4}{b['flops'] / 1e9:>15.3f}{r['batched_flop_ratio']:>7.3f}"
                  f"{b['wall_seconds']:>16.3f}{r['batched_wall_ratio']:>7.3f}"
                  f"{b['wall_seconds'] / r['shared']['wall_seconds']:>11.3f}{fb['wall_seconds']:>21.3f}"
                  f"{r['full_batched_wall_ratio']:>9.3f}")
    with open(args.out, "w") as f:
        json.dump({"setup": vars(args), "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
