"""One benchmark run in its own process: one schedule on one workload; writes a result JSON and step traces.

    python -m benchmarks.run_one --json-args '{"schedule": "sync", "workload": {...},
        "out_dir": "...", "model_dir": "...", "result": "...", "pin": false}'

Schedules: "sync" and "thundersync" (`ThunderSyncGRPOTrainer`; "thundersync:<release>" sets
`ThunderSyncGRPOConfig.release`, plain "thundersync" is reward release), "trl" (stock `trl.GRPOTrainer`; with the
scripted agent it gets the very same trajectories through a `rollout_func` that runs the same agent loop and sandbox
for the whole batch). Every run uses one torch thread for the learner. Per step it records the wall time from
`on_step_begin` to `on_step_end` (after the new weights are published) and a `StepTrace`: ThunderSync writes its own
(`<out_dir>/thundersync_trace/steps.jsonl`); for TRL this module writes one in the same format with schedule "trl"
(rollout = TRL's generation call, one learner item = scoring + loss + backward of the whole batch). The process's
peak RSS (itself + its largest finished child) goes into the result. The parent (`python -m benchmarks`)
does all the statistics.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from benchmarks.parity import cpu_config, load_model  # noqa: E402
from trl_thundersync.streaming.flops import ModelShape, learner_flops  # noqa: E402
from trl_thundersync.tiny.model import save_tiny_model  # noqa: E402
from trl_thundersync.trace.recorder import TraceWriter  # noqa: E402
from trl_thundersync.trace.records import StepTrace, TraceEvent  # noqa: E402

from .affinity import CorePlan, busy_cpu_seconds, current_plan, pin_thread, pinned_pool  # noqa: E402
from .workload import Workload, bench_dataset, bench_delay, bench_script, env_factory, split_schedule  # noqa: E402

TRACE_FILE = Path("thundersync_trace") / "steps.jsonl"


def thread_usage() -> tuple[float, int]:
    """The calling thread's CPU seconds so far and its involuntary context switches (times the scheduler took its
    core away while it could run)."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime, usage.ru_nivcsw


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step: on_step_begin → on_step_end (added last, so after publication), and the
    CPU seconds and preemptions of the thread that runs the step (the learner's: `training_step` runs there)."""

    def __init__(self) -> None:
        self.begin = 0.0
        self.usage0 = (0.0, 0)
        self.intervals: list[tuple[float, float]] = []
        self.learner_cpu: list[tuple[float, int]] = []  # per step: (CPU seconds, involuntary context switches)
        self.on_end = None  # optional hook(begin, end)

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin = time.perf_counter()
        self.usage0 = thread_usage()

    def on_step_end(self, args, state, control, **kwargs):
        end = time.perf_counter()
        cpu, switches = thread_usage()
        self.learner_cpu.append((cpu - self.usage0[0], switches - self.usage0[1]))
        self.intervals.append((self.begin, end))
        if self.on_end is not None:
            self.on_end(self.begin, end)


def _common(w: Workload, out_dir: Path) -> dict:
    return dict(per_device_train_batch_size=w.batch, num_generations=w.group, max_steps=w.steps,
                max_completion_length=w.max_completion_tokens, learning_rate=1e-5, seed=w.seed,
                logging_steps=1, disable_tqdm=True)


def use_rollout_pools(engine, slots: int, plan: CorePlan | None):
    """Give an `AgentRolloutEngine` (and its scripted generator and tool runner) fresh thread pools: at most `slots`
    trajectories in flight (the engine's pool only starts trajectories), pinned to the rollout cores under `plan`."""
    from concurrent.futures import ThreadPoolExecutor

    def pool(workers: int, name: str) -> ThreadPoolExecutor:
        if plan is None:
            return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        return pinned_pool(workers, plan.rollout, name)

    engine.pool.shutdown(wait=False)
    engine.pool = pool(slots, "bench-agent")
    engine.tool_runner.pool.shutdown(wait=False)
    engine.tool_runner.pool = pool(max(8, slots), "bench-tool")
    generator = engine.generator
    if hasattr(generator, "script"):  # the scripted generator: its delays and tokenization are rollout work too
        generator.pool.shutdown(wait=False)
        generator.pool = pool(max(8, slots), "bench-generator")
    return engine


def build_thundersync(w: Workload, schedule: str, model_path: str, tokenizer, out_dir: Path,
                      plan: CorePlan | None, release: str = "reward"):
    from benchmarks.scripted import ScriptedTurnGenerator
    from trl_thundersync.trainers.grpo.config import ThunderSyncGRPOConfig
    from trl_thundersync.trainers.grpo.trainer import ThunderSyncGRPOTrainer

    # agent_protocol="paper": the published BENCHMARKS.md figures were measured with it (its stock-TRL side below
    # runs the same paper loop through rollout_func)
    extra = dict(schedule=schedule, release=release, reward_scope=w.reward_scope, agent_protocol="paper",
                 agent_max_turns=w.turns + 1, learner_num_threads=1, rollout_num_threads=1,
                 rollout_max_in_flight=w.concurrency)
    if w.shared_prefix is not None:  # on: every group, whatever its prompt length (the threshold's floor)
        extra["shared_prefix"] = w.shared_prefix
        if w.shared_prefix:
            extra["shared_prefix_min_prompt_tokens"] = 1
    if w.batch_members is not None:
        extra["batch_group_members"] = w.batch_members
    if w.adaptive_turns is not None and schedule == "thundersync" and release == "turn":
        extra["adaptive_turn_release"] = w.adaptive_turns
    args = cpu_config(ThunderSyncGRPOConfig, out_dir, **_common(w, out_dir), **extra)
    trainer = ThunderSyncGRPOTrainer(model=load_model(model_path), reward_funcs=[], args=args,
                                     train_dataset=bench_dataset(), processing_class=tokenizer,
                                     environment_factory=env_factory(w))
    step = lambda: trainer.state.global_step  # noqa: E731
    generator = ScriptedTurnGenerator(tokenizer, bench_script(w, step), delay=bench_delay(w, step),
                                      workers=max(8, w.concurrency))
    use_rollout_pools(trainer.use_turn_generator(generator), w.concurrency, plan)
    return trainer


class ScriptedBatchRollout:
    """TRL `rollout_func`: the same scripted agent loop, environments and sandbox, synchronously for a batch."""

    def __init__(self, w: Workload, tokenizer, plan: CorePlan | None) -> None:
        self.w = w
        self.plan = plan
        self.tokenizer = tokenizer
        self.engine = None
        self.trainer = None
        self.last: list = []

    def _build(self, trainer):
        from benchmarks.scripted import ScriptedTurnGenerator
        from trl_thundersync.envs.harness.agent_loop import AgentLimits
        from trl_thundersync.rollout.agent_setup import make_agent_engine

        w = self.w
        step = lambda: trainer.state.global_step  # noqa: E731
        generator = ScriptedTurnGenerator(self.tokenizer, bench_script(w, step), delay=bench_delay(w, step),
                                          workers=max(8, w.concurrency))
        budget = w.max_completion_tokens
        limits = AgentLimits(max_turns=w.turns + 1, max_tokens_per_turn=budget, max_completion_tokens=budget,
                             max_context_tokens=8192, max_observation_tokens=256, tool_timeout_s=60.0)
        # Rendered as ThunderSync renders it (TRL's template rule for a trainer with the environment's tools), so
        # prompts and tool framings are token-identical between the trainers.
        self.engine = make_agent_engine(
            generator, processing_class=trainer.processing_class, tokenizer=self.tokenizer, limits=limits,
            environment_factory=env_factory(w), chat_template_kwargs=getattr(trainer, "chat_template_kwargs", None),
            max_concurrent=w.concurrency)
        use_rollout_pools(self.engine, w.concurrency, self.plan)

    def __call__(self, prompts, trainer):
        from trl_thundersync.trainers.lifecycle import trajectory_seed
        from trl_thundersync.types import RolloutRequest

        if self.engine is None:
            self._build(trainer)
        step = trainer.state.global_step
        requests = [RolloutRequest(index=i, group=i // self.w.group, prompt_ids=(),
                                   seed=trajectory_seed(self.w.seed, step, i), prompt=p, row={"prompt": p})
                    for i, p in enumerate(prompts)]
        self.engine.start_batch(requests, self.engine.generator.policy_version)
        rollouts = sorted(self.engine.results(), key=lambda r: r.index)
        rewards = [self.engine.environments[r.index].get_reward() for r in rollouts]
        self.last = rollouts
        return {"prompt_ids": [list(r.prompt_ids) for r in rollouts],
                "completion_ids": [list(r.completion_ids) for r in rollouts],
                "logprobs": [list(r.sampling_logprobs) for r in rollouts],
                "env_mask": [list(r.env_mask) for r in rollouts], "env_reward": rewards}


def env_reward(env_reward, **kwargs):
    """The environment's reward, passed through `rollout_func`'s extra field."""
    return env_reward


def build_trl(w: Workload, model_path: str, tokenizer, out_dir: Path, timer: StepTimer, plan: CorePlan | None):
    from trl import GRPOConfig, GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        """Stock GRPOTrainer; only times its generation call and its training step, for the trace."""

        marks: dict = {}

        def _generate(self, prompts):
            start = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                self.marks.update(rollout=(start, time.perf_counter()))

        def training_step(self, *args, **kwargs):
            start = time.perf_counter()
            loss = super().training_step(*args, **kwargs)
            self.marks.update(step=(start, time.perf_counter()))
            return loss

    args = cpu_config(GRPOConfig, out_dir, **_common(w, out_dir))
    rollout = ScriptedBatchRollout(w, tokenizer, plan)
    trainer = TimedGRPOTrainer(model=load_model(model_path), reward_funcs=[env_reward], args=args,
                               train_dataset=bench_dataset(), processing_class=tokenizer, rollout_func=rollout)
    shape = ModelShape.from_config(trainer.model.config)
    writer = TraceWriter(out_dir / TRACE_FILE)

    def on_end(begin: float, end: float) -> None:
        r0, r1 = trainer.marks["rollout"]
        s0, s1 = trainer.marks["step"]
        events = []
        tokens = []
        for r in rollout.last:
            tokens.append(len(r.prompt_ids) + len(r.completion_ids))
            events.append(TraceEvent("rollout", "trajectory", r.started_at, r.finished_at, r.index, r.group,
                                     tokens=len(r.completion_ids)))
            for start, stop in (r.agent.tool_intervals if r.agent else ()):
                events.append(TraceEvent("tool", "tool_call", start, stop, r.index, r.group))
        flops = sum(learner_flops(shape, n) for n in tokens)
        events.append(TraceEvent("learner", "score_loss_backward", r1, s1, ready=r1, tokens=sum(tokens),
                                 flops=flops))
        events.append(TraceEvent("barrier", "optimizer", s1, end))
        writer.append(StepTrace(step=len(timer.intervals) - 1, schedule="trl", start=r0, rollout_end=r1,
                                learner_end=s1, barrier_end=end, publish_end=end, events=tuple(events)))

    timer.on_end = on_end
    return trainer


def peak_rss_mb() -> dict[str, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"self": own, "children": children, "total": own + children}


def _own_cpu_seconds() -> float:
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


class RunMeter:
    """Wall time and CPU accounting of one benchmark run: started before the trainer is built."""

    def __init__(self) -> None:
        self.started, self.busy0, self.own0 = time.perf_counter(), busy_cpu_seconds(), _own_cpu_seconds()

    def train(self, trainer, timer: StepTimer) -> dict:
        """Train with `timer` attached, close the trainer, and return the result fields every benchmark run has."""
        trainer.add_callback(timer)
        trainer.train()
        if hasattr(trainer, "close"):
            trainer.close()
        wall = time.perf_counter() - self.started
        own = _own_cpu_seconds() - self.own0
        # CPU other processes on the machine used meanwhile, in cores (a benchmark on a shared machine must say so).
        foreign = max(0.0, busy_cpu_seconds() - self.busy0 - own) / wall
        return {"step_intervals": timer.intervals, "learner_thread_cpu": timer.learner_cpu,
                "peak_rss_mb": peak_rss_mb(), "num_params": sum(p.numel() for p in trainer.model.parameters()),
                "run_seconds": wall,
                "cpu_cores_used": own / wall, "foreign_cpu_cores": foreign}


def run(spec: dict) -> dict:
    w = Workload.from_dict(spec["workload"])
    schedule = spec["schedule"]
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TRACE_FILE).unlink(missing_ok=True)
    hf_logging.set_verbosity_error()
    plan = None
    if spec.get("pin"):
        plan = current_plan()
        pin_thread(plan.learner)  # before torch starts its threads: they inherit the learner core
    torch.set_num_threads(1)
    model_path = str(save_tiny_model(spec["model_dir"], w.hidden, w.layers))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    timer = StepTimer()
    meter = RunMeter()
    try:
        trainer_schedule, release = split_schedule(schedule)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if trainer_schedule == "trl":
        trainer = build_trl(w, model_path, tokenizer, out_dir, timer, plan)
    else:
        trainer = build_thundersync(w, trainer_schedule, model_path, tokenizer, out_dir, plan, release)
    measured = meter.train(trainer, timer)
    return {"schedule": schedule, "release": release, "workload": w.to_dict(), "trace": str(out_dir / TRACE_FILE),
            **measured, "torch_threads": torch.get_num_threads(),
            "pinning": None if plan is None else {"learner": sorted(plan.learner), "rollout": sorted(plan.rollout)},
            "learner_thread_cpus": sorted(os.sched_getaffinity(0))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json-args", required=True,
                        help="JSON object: schedule, workload, out_dir, model_dir, result, pin")
    spec = json.loads(parser.parse_args(argv).json_args)
    result = run(spec)
    Path(spec["result"]).write_text(json.dumps(result, indent=1))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
