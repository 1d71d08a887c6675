"""Does rollout generation in a thread starve a concurrent learner? Thread vs process, measured side by side.

A fixed learner workload (forward + backward of the tiny model on fixed sequences, in the main thread) runs
alone, then concurrently with one `LocalProcessEngine` batch in `mode="thread"` (same process: the generation loop
competes for the GIL), then in `mode="process"` (spawned worker). Engine start-up is excluded from every timing.
Generation time is start_batch → last `finished_at`. Both sides use one intra-op thread by default.

A calibration row runs the learner next to a spawned process that runs the same learner workload in a loop: no GIL
is shared, so its slowdown is what the hardware alone imposes (shared cores, memory bandwidth, SMT). The process
engine can do no better than that floor; the gap between the thread engine and the floor is the GIL's cost.

    python -m benchmarks.gil_overlap --out outputs/gil_overlap.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.multiprocessing

from trl_thundersync.rollout.local import LocalProcessEngine
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer
from trl_thundersync.types import RolloutRequest, SamplingParams


@dataclass(frozen=True)
class OverlapResult:
    """Median seconds over the repeats of one configuration."""

    setting: str  # "learner alone", "generation alone (thread)", "learner + thread engine", ...
    learner_seconds: float | None  # wall time of the learner workload, None when it did not run
    generation_seconds: float | None  # start_batch → last trajectory finished, None when no generation ran
    tokens: int  # completion tokens generated in one batch (0 without generation)


def _learner_workload(model: torch.nn.Module, batch: torch.Tensor, steps: int) -> float:
    """`steps` forward+backward passes on a fixed batch [B, T]; returns the wall time."""
    start = time.perf_counter()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        model(input_ids=batch, labels=batch).loss.backward()
    return time.perf_counter() - start


def _busy_learner(ready, stop, threads: int) -> None:
    """Calibration process: the learner workload in a loop until `stop` is set."""
    torch.set_num_threads(threads)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    batch = torch.randint(0, len(tokenizer), (8, 64), generator=torch.Generator().manual_seed(1))
    ready.set()
    while not stop.is_set():
        _learner_workload(model, batch, 1)


def _measure_hardware_floor(learner, batch, steps: int, threads: int, repeats: int) -> OverlapResult:
    """Learner time next to an independent busy process (see the module docstring)."""
    ctx = torch.multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_busy_learner, args=(ready, stop, threads), daemon=True)
    proc.start()
    try:
        if not ready.wait(timeout=120):
            raise RuntimeError(f"calibration process did not start (exit code {proc.exitcode})")
        _learner_workload(learner, batch, 2)
        runs = [_learner_workload(learner, batch, steps) for _ in range(repeats)]
    finally:
        stop.set()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    return OverlapResult("learner + busy process (floor)", statistics.median(runs), None, 0)


def _run_once(engine: LocalProcessEngine | None, learner, batch, steps, requests) -> tuple[float | None, ...]:
    """One batch and/or one learner workload, started together; (learner s, generation s, tokens)."""
    start = time.perf_counter()
    if engine is not None:
        engine.start_batch(requests, policy_version=0)
    learner_s = _learner_workload(learner, batch, steps) if learner is not None else None
    if engine is None:
        return learner_s, None, 0
    rollouts = list(engine.results())
    gen_s = max(r.finished_at for r in rollouts) - start
    return learner_s, gen_s, sum(len(r.completion_ids) for r in rollouts)


def _measure(setting, engine, learner, batch, steps, requests, repeats) -> OverlapResult:
    runs = [_run_once(engine, learner, batch, steps, requests) for _ in range(repeats)]
    learner_s = statistics.median(r[0] for r in runs) if learner is not None else None
    gen_s = statistics.median(r[1] for r in runs) if engine is not None else None
    return OverlapResult(setting, learner_s, gen_s, runs[0][2])


def main(argv: list[str] | None = None) -> list[OverlapResult]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/gil_overlap.json", help="JSON output path")
    parser.add_argument("--learner-steps", type=int, default=40, help="forward+backward passes per measurement")
    parser.add_argument("--learner-batch", type=int, default=8, help="sequences per learner pass")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per learner sequence")
    parser.add_argument("--requests", type=int, default=16, help="trajectories in the generation batch")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-in-flight", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the learner and of the worker")
    parser.add_argument("--repeats", type=int, default=3, help="median over this many runs per setting")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_model(tokenizer)
    learner = build_tiny_model(tokenizer)
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, len(tokenizer), (args.learner_batch, args.seq_len), generator=gen)
    prompt = tuple(tokenizer("user: What is 2 + 3? assistant:")["input_ids"])
    requests = [RolloutRequest(i, i, prompt, seed=i) for i in range(args.requests)]
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)  # no EOS: every trajectory has the same length

    _learner_workload(learner, batch, 2)  # warm-up
    engines = {m: LocalProcessEngine(policy, sampling, mode=m, max_in_flight=args.max_in_flight,
                                     num_threads=args.threads) for m in ("thread", "process")}  # fmt: skip
    try:
        for engine in engines.values():  # warm-up
            _run_once(engine, None, batch, 0, requests[:2])
        results = [_measure("learner alone", None, learner, batch, args.learner_steps, requests, args.repeats)]
        results.append(_measure_hardware_floor(learner, batch, args.learner_steps, args.threads, args.repeats))
        for mode, engine in engines.items():
            results.append(_measure(f"generation alone ({mode})", engine, None, batch, 0, requests, args.repeats))
            results.append(
                _measure(f"learner + {mode} engine", engine, learner, batch, args.learner_steps, requests, args.repeats)
            )
    finally:
        for engine in engines.values():
            engine.close()
    _report(results, args)
    return results


def _report(results: list[OverlapResult], args: argparse.Namespace) -> None:
    by = {r.setting: r for r in results}
    alone = by["learner alone"].learner_seconds
    print(f"{'setting':<30}{'learner s':>11}{'vs alone':>10}{'generation s':>14}{'vs alone':>10}{'tok/s':>9}")
    for r in results:
        mode = "thread" if "thread" in r.setting else "process"
        gen_alone = by[f"generation alone ({mode})"].generation_seconds
        ls = f"{r.learner_seconds:11.3f}{r.learner_seconds / alone:9.2f}x" if r.learner_seconds else " " * 21
        gs = f"{r.generation_seconds:14.3f}{r.generation_seconds / gen_alone:9.2f}x" if r.generation_seconds else ""
        tps = f"{r.tokens / r.generation_seconds:9.0f}" if r.generation_seconds else ""
        print(f"{r.setting:<30}{ls}{gs}{tps}")
    thread, proc = by["learner + thread engine"], by["learner + process engine"]
    summary = {
        "learner_slowdown_thread": thread.learner_seconds / alone,
        "learner_slowdown_process": proc.learner_seconds / alone,
        "learner_slowdown_hardware_floor": by["learner + busy process (floor)"].learner_seconds / alone,
        "generation_slowdown_thread": thread.generation_seconds / by["generation alone (thread)"].generation_seconds,
        "generation_slowdown_process": proc.generation_seconds / by["generation alone (process)"].generation_seconds,
    }
    print("  ".join(f"{k}={v:.2f}" for k, v in summary.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"args": vars(args), "cpu_count": os.cpu_count(), "results": [asdict(r) for r in results]}
    out.write_text(json.dumps({**payload, "summary": summary}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
