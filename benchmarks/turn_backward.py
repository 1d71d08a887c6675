"""Learner cost of per-turn distillation: naive per-turn backward vs boundary-cut backward (deferred state adjoints).

Same synthetic multi-turn trajectories, same tiny student and fake teacher, both variants; prints a table and writes
JSON. FLOPs are counted by `torch.utils.flop_counter.FlopCounterMode` (matrix products of forward and backward),
wall time is the median of `--repeats` runs; the relative error of the two gradient sums is reported too.

    python -m benchmarks.turn_backward --turns 8 --out turn_backward.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.turns import SeededTeacher, synthetic_trajectory
from trl_thundersync.distill.losses import opd_loss_sum
from trl_thundersync.distill.turn_backward import BoundaryCutBackward, GradientSum, NaiveTurnBackward
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer


def _run(cls, model, trajectories, scores):
    params = [p for p in model.parameters() if p.requires_grad]
    grads = GradientSum(params)
    backward = cls(model, params, lambda logits, actions, teacher: opd_loss_sum(logits, actions, teacher.logprobs),
                   grads)
    for events, turn_scores in zip(trajectories, scores, strict=True):
        for event, teacher in zip(events, turn_scores, strict=True):
            backward.turn(event, teacher)
        backward.close(events[0].index)
    return torch.cat([b.reshape(-1) for b in grads.buffers])


def measure(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=args.hidden, num_layers=args.layers)
    model.train()
    vocab = model.config.vocab_size
    trajectories = [synthetic_trajectory(i, vocab, prompt=args.prompt, actions=[args.action] * args.turns,
                                         framings=[args.framing] * (args.turns - 1), seed=i)
                    for i in range(args.trajectories)]
    teacher = SeededTeacher(vocab)
    scores = [[teacher.score(e.context_ids, e.action_ids) for e in events] for events in trajectories]
    rows, directions = {}, {}
    for name, cls in (("naive", NaiveTurnBackward), ("boundary_cut", BoundaryCutBackward)):
        with FlopCounterMode(display=False) as counter:
            directions[name] = _run(cls, model, trajectories, scores)
        walls = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            _run(cls, model, trajectories, scores)
            walls.append(time.perf_counter() - start)
        rows[name] = {"flops": float(counter.get_total_flops()), "wall_seconds": statistics.median(walls)}
    error = float((directions["boundary_cut"] - directions["naive"]).norm() / directions["naive"].norm())
    tokens = args.prompt + args.turns * args.action + (args.turns - 1) * args.framing
    return {"setup": {**vars(args), "tokens_per_trajectory": tokens,
                      "parameters": sum(p.numel() for p in model.parameters())},
            "naive": rows["naive"], "boundary_cut": rows["boundary_cut"],
            "flop_ratio": rows["naive"]["flops"] / rows["boundary_cut"]["flops"],
            "speedup": rows["naive"]["wall_seconds"] / rows["boundary_cut"]["wall_seconds"],
            "relative_error": error}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--action", type=int, default=32, help="action tokens per turn")
    parser.add_argument("--framing", type=int, default=48, help="observation tokens between turns")
    parser.add_argument("--trajectories", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="turn_backward.json")
    args = parser.parse_args(argv)
    result = measure(args)
    print(f"{args.trajectories} trajectories × {args.turns} turns, {result['setup']['tokens_per_trajectory']} tokens "
          f"each, {result['setup']['parameters']:,} parameters")
    print(f"{'variant':<14}{'GFLOP':>10}{'wall s':>10}")
    for name in ("naive", "boundary_cut"):
        print(f"{name:<14}{result[name]['flops'] / 1e9:>10.3f}{result[name]['wall_seconds']:>10.3f}")
    print(f"FLOP ratio naive/cut {result['flop_ratio']:.2f}×, wall speedup {result['speedup']:.2f}×, "
          f"relative error of the gradient sums {result['relative_error']:.2e}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
