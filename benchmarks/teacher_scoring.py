"""Teacher cost of multi-turn on-policy distillation: one scoring request per turn vs one per trajectory.

A teacher request asks for `prompt_logprobs`, which vLLM never serves from its prefix cache, so each request
prefills its whole sequence: per-turn scoring prefills Σ_j |c_j| + |a_j| tokens per trajectory (quadratic in the
turns), per-trajectory scoring |c_J| + |a_J| (linear). This measures both over the real client path: a
`ServerTeacher` against the embedded server (`trl_thundersync.serve`, vLLM's `/v1/completions` contract) serving a
tiny teacher, on synthetic trajectories of J turns, through the distillation pipeline's teacher thread
(`distill.teacher_schedule`): requests, prefill tokens (measured, and the closed form), teacher seconds, and the
largest relative difference between the two schedules' log-probs (the same numbers up to FP32 rounding).

    python -m benchmarks.teacher_scoring --turns 2,4,8 --out teacher_scoring.json

On a GPU server the prefill cost is what scales with tokens; on these CPU cores the tiny teacher's per-request
overhead (HTTP, Python) is a large part of a short request, so the measured seconds understate the saving that the
token ratio predicts for a real teacher.
"""

from __future__ import annotations

import argparse
import json
import queue
import tempfile
import time

import torch

from benchmarks.turns import synthetic_trajectory
from trl_thundersync.distill.pipeline import DONE, _teach
from trl_thundersync.distill.records import ScoredTurn, TrajectoryClosed
from trl_thundersync.distill.teacher_schedule import TeacherLedger
from trl_thundersync.distill.teacher_server import ServerTeacher
from trl_thundersync.serve import EmbeddedServer, ServerThread
from trl_thundersync.tiny.model import save_tiny_model
from trl_thundersync.types import Rollout


def _score_all(teacher, trajectories, scoring: str) -> tuple[dict, float, dict]:
    """Every trajectory's turns through the teacher thread, as the pipeline feeds it: turns, then the close."""
    inbox, out, ledger = queue.Queue(), queue.Queue(), TeacherLedger()
    for events in trajectories:
        for event in events:
            inbox.put(event)
        last = events[-1]
        rollout = Rollout(index=last.index, group=last.index, policy_version=0, prompt_ids=events[0].context_ids,
                          completion_ids=(last.context_ids + last.action_ids)[len(events[0].context_ids):])
        inbox.put(TrajectoryClosed(rollout, len(events), time.perf_counter()))
    inbox.put(DONE)
    start = time.perf_counter()
    _teach(teacher, None, scoring, ledger, inbox, out)
    wall = time.perf_counter() - start
    scores = {}
    while True:
        item = out.get_nowait()
        if item is DONE:
            break
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, ScoredTurn):
            scores[(item.event.index, item.event.turn)] = item.teacher.logprobs
    return scores, wall, vars(ledger.load())


def measure(args: argparse.Namespace) -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny_model(f"{tmp}/teacher", hidden_size=args.hidden, num_layers=args.layers, seed=7)
        with ServerThread(EmbeddedServer(str(path), max_in_flight=4)) as server:
            teacher = ServerTeacher(server.url)
            vocab = 500
            for turns in args.turns:
                trajectories = [synthetic_trajectory(i, vocab, prompt=args.prompt, actions=[args.action] * turns,
                                                     framings=[args.observation] * (turns - 1), seed=i)
                                for i in range(args.trajectories)]
                _score_all(teacher, trajectories[:1], "turn")  # warm-up
                per_turn, turn_wall, turn_load = _score_all(teacher, trajectories, "turn")
                per_traj, traj_wall, traj_load = _score_all(teacher, trajectories, "trajectory")
                diff = max(float((per_turn[k] - per_traj[k]).abs().max()) for k in per_turn if per_turn[k].numel())
                step = args.action + args.observation
                closed_turn = turns * (args.prompt + args.action) + step * turns * (turns - 1) // 2
                closed_traj = args.prompt + turns * args.action + (turns - 1) * args.observation
                rows.append({"turns": turns, "turn": {**turn_load, "wall_seconds": turn_wall},
                             "trajectory": {**traj_load, "wall_seconds": traj_wall},
                             "closed_form_tokens": {"turn": closed_turn * args.trajectories,
                                                    "trajectory": closed_traj * args.trajectories},
                             "max_abs_logprob_difference": diff})
    return {"setup": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows,
            "torch": torch.__version__}


def table(result: dict) -> str:
    lines = ["| turns | requests turn / traj | prefill tokens turn / traj (ratio) | closed form ratio | "
             "teacher s turn / traj (ratio) | max abs Δ log-prob |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        t, j, c = r["turn"], r["trajectory"], r["closed_form_tokens"]
        lines.append(f"| {r['turns']} | {t['requests']} / {j['requests']} | {t['prefill_tokens']} / "
                     f"{j['prefill_tokens']} ({t['prefill_tokens'] / j['prefill_tokens']:.2f}×) | "
                     f"{c['turn'] / c['trajectory']:.2f}× | {t['wall_seconds']:.2f} / {j['wall_seconds']:.2f} "
                     f"({t['wall_seconds'] / j['wall_seconds']:.2f}×) | {r['max_abs_logprob_difference']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8])
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=96, help="prompt tokens")
    parser.add_argument("--action", type=int, default=24, help="action tokens per turn")
    parser.add_argument("--observation", type=int, default=48, help="tool-observation tokens between turns")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", default="teacher_scoring.json")
    args = parser.parse_args(argv)
    result = measure(args)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=2)
    print(table(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
