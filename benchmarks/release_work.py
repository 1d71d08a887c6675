"""Learner work of one logical GRPO batch per release point, with and without the shared prefix, side by side.

The same multi-turn batch (`--groups` groups of `--group` members over one random prompt each; every member's
completion is `len(--actions)` actions separated by `--framings` observation tokens, as `benchmarks --preset
quick-grading` trajectories are: a ~100-token prompt, two tool calls and an answer) is learned by the wired GRPO
learner (`GRPOBatchLearner` with `TrajectoryBackward`, and `TurnScoreBackward` under turn release) at the same θ:

    content:  each trajectory's whole backward once its content is final (the default release point)
    turn:     each turn's backward when its action ends (boundary cut), the deferred adjoints replayed at its close
    turn+prefix+coalesced: every trajectory's turns ready together, learned as one segment (`coalesce.py`: what a
              learner that is far behind its rollouts does)

each with `shared_prefix` off and on. Learner busy time is the wall time of the learner's calls (all turns, contents,
rewards and the barrier's fold), the median of `--repeats` interleaved runs after one untimed warm-up run each, so
machine noise hits every variant; the ratio of the fastest runs is printed too. Learner FLOPs are the passes' (the
ledger's accounting, `shared_prefix.pass_flops`): a turn forwards its new tokens over its history and back-propagates
them once per channel at the turn and once more, with the later turns' adjoints, at the close (all but the last
segment). The relative error of every variant's batch direction against content release without the prefix checks
that all computed the same update.

    python -m benchmarks.release_work                       # quick-grading's shape (192 × 4), 8 groups of 4
    python -m benchmarks.release_work --prompt 800 --actions 40 40 50 --framings 20 20   # a long agentic prompt
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from trl_thundersync.streaming.learner import GRPOBatchLearner
from trl_thundersync.streaming.normalization import LossNormalization
from trl_thundersync.streaming.prefix_groups import PrefixGroups
from trl_thundersync.streaming.shared_prefix import PassWork, pass_flop_counter
from trl_thundersync.streaming.source import TrajectoryBackward
from trl_thundersync.streaming.turn_grpo import TurnScoreBackward
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer
from trl_thundersync.types import Rollout, ScoredRollout, TurnEvent

EOS = 7
VARIANTS = ("content", "content+prefix", "turn", "turn+prefix", "turn+prefix+coalesced")


def make_batch(vocab: int, groups: int, size: int, prompt: int, actions: list[int], framings: list[int],
               seed: int = 0) -> tuple[list[ScoredRollout], list[TurnEvent]]:
    """The scored trajectories and their turn events (turn order: every trajectory's turn 0, then turn 1, ...)."""
    gen = torch.Generator().manual_seed(seed)

    def draw(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(8, vocab, (n,), generator=gen).tolist())

    batch, turns = [], []
    for g in range(groups):
        head = draw(prompt)
        for m in range(size):
            index, context, mask = g * size + m, head, []
            for j, n in enumerate(actions):
                action = draw(max(1, n + (m % 3 - 1) * max(1, n // 8)))
                turns.append(TurnEvent(index, j, 0, context, action, 0.0))
                framing = draw(framings[j]) if j < len(framings) else ()
                context, mask = context + action + framing, mask + [1] * len(action) + [0] * len(framing)
            rollout = Rollout(index=index, group=g, policy_version=0, prompt_ids=head,
                              completion_ids=context[len(head):], env_mask=tuple(mask))
            reward = float(torch.rand((), generator=gen))
            batch.append(ScoredRollout(rollout, (reward,), reward, 0.0))
    turns.sort(key=lambda e: (e.turn, e.index))
    return batch, turns


def _logps_fn(model):
    def logps(ids, mask, keep):
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep + 1).logits[:, :-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -keep:, None])[..., 0]
    return logps


def run(model, params, batch, turns, variant: str) -> tuple[torch.Tensor, float, float]:
    """One logical batch through the learner; its policy direction, busy seconds, and the FLOPs of its passes."""
    release, shared, coalesced = variant.split("+")[0], "+prefix" in variant, variant.endswith("+coalesced")
    size = sum(1 for s in batch if s.rollout.group == 0)
    norm = LossNormalization("grpo", len(batch), 1, max(len(s.rollout.completion_ids) for s in batch))
    counter = pass_flop_counter(model, params)
    prefixes = PrefixGroups(model=model, params=params, group_size=size, max_open=len(batch) // size,
                            flops=counter) if shared else None
    backward = TrajectoryBackward(params=params, logps_fn=_logps_fn(model), normalization=norm, eos_and_pad=(EOS,),
                                  mask_truncated=False, prefixes=prefixes)
    turn_source = TurnScoreBackward(model=model, params=params, normalization=norm, eos_and_pad=(EOS,),
                                    mask_truncated=False, policy_version=0, prefixes=prefixes) \
        if release == "turn" else None
    learner = GRPOBatchLearner(batch_size=len(batch), num_generations=size, num_params=sum(p.numel() for p in params),
                               policy_version=0, scale_rewards="group", source_backward=backward, release=release,
                               content_backward=backward.content, turn_source=turn_source, prefixes=prefixes)
    start = time.perf_counter()
    if coalesced:  # every trajectory's turns ready together (a learner far behind its rollouts)
        for index in range(len(batch)):
            learner.submit_turns([e for e in turns if e.index == index])
    for event in turns if release == "turn" and not coalesced else ():
        learner.submit_turn(event)
    for source in batch:
        learner.submit_content(source.rollout)
    for source in batch:
        learner.submit(source)
    totals = learner.finish()
    busy = time.perf_counter() - start
    return totals.accumulator.policy[0], busy, _flops(counter, batch, turns, release, shared, coalesced)


def _flops(counter, batch, turns, release: str, shared: bool, coalesced: bool = False) -> float:
    """The passes each variant runs, priced by `pass_flops` (see the module docstring)."""
    prompt = {s.rollout.group: len(s.rollout.prompt_ids) for s in batch}
    total = sum(counter(PassWork(p, 0, 1)) for p in prompt.values()) if shared else 0.0
    if release == "content" or coalesced:  # (coalesced: one segment per trajectory, no replay)
        for s in batch:
            p, c = len(s.rollout.prompt_ids), len(s.rollout.completion_ids)
            total += counter(PassWork(c, p, 1)) if shared else counter(PassWork(p + c, 0, 1))
        return total
    history: dict[int, int] = {}
    last = {e.index: e.turn for e in turns}
    for e in turns:  # turn order: each segment forwarded once, back-propagated at its turn and (not last) at close
        seen = history.get(e.index, prompt[batch[e.index].rollout.group] if shared else 0)
        new = len(e.context_ids) + len(e.action_ids) - seen
        total += counter(PassWork(new, seen, 1 + (e.turn != last[e.index])))
        history[e.index] = seen + new
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="members per group")
    parser.add_argument("--prompt", type=int, default=100, help="prompt tokens")
    parser.add_argument("--actions", type=int, nargs="+", default=[75, 74, 26], help="action tokens per turn")
    parser.add_argument("--framings", type=int, nargs="*", default=[6, 6], help="observation tokens after each")
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the benchmarks' learner: 1)")
    parser.add_argument("--out", default="release_work.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = build_tiny_model(build_tiny_tokenizer(), hidden_size=args.hidden, num_layers=args.layers, seed=0)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    batch, turns = make_batch(model.config.vocab_size, args.groups, args.group, args.prompt, args.actions,
                              args.framings)
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    results = {v: run(model, params, batch, turns, v) for v in VARIANTS}  # warm-up, and the directions
    for _ in range(args.repeats):
        for v in VARIANTS:
            results[v] = run(model, params, batch, turns, v)
            walls[v].append(results[v][1])
    reference = results["content"][0]
    rows = {v: {"busy_seconds": statistics.median(walls[v]), "busy_runs": walls[v], "flops": results[v][2],
                "relative_error": float((results[v][0] - reference).norm() / reference.norm())} for v in VARIANTS}
    tokens = sum(len(s.rollout.prompt_ids) + len(s.rollout.completion_ids) for s in batch)
    print(f"tiny Qwen3 ({args.hidden} wide, {args.layers} layers), {args.groups} groups × {args.group}, prompt "
          f"{args.prompt}, actions {args.actions}, framings {args.framings} ({tokens / len(batch):.0f} tokens per "
          f"trajectory), median of {args.repeats}, {args.threads} thread(s)")
    print(f"{'variant':<24}{'busy s':>8}{'vs content':>12}{'(fastest)':>11}{'GFLOP':>9}{'vs content':>12}"
          f"{'rel. error':>12}")
    base = rows["content"]
    for v, r in rows.items():
        print(f"{v:<24}{r['busy_seconds']:>8.3f}{r['busy_seconds'] / base['busy_seconds']:>11.2f}x"
              f"{min(r['busy_runs']) / min(base['busy_runs']):>10.2f}x{r['flops'] / 1e9:>9.2f}"
              f"{r['flops'] / base['flops']:>11.2f}x{r['relative_error']:>12.1e}")
    turn, content = rows["turn+prefix"], rows["content+prefix"]
    print(f"turn / content release, both with the shared prefix: busy "
          f"{turn['busy_seconds'] / content['busy_seconds']:.2f}x, FLOPs {turn['flops'] / content['flops']:.2f}x")
    with open(args.out, "w") as f:
        json.dump({"setup": vars(args), "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
