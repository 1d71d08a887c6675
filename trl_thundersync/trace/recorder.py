"""Turn one batch's learner work, rollouts and landmarks into a `StepTrace` (one builder for GRPO and distillation),
and append it to a JSON-lines file.

On by default (`ThunderSyncGRPOConfig.trace`, `ThunderSyncGKDConfig.trace`): one line per optimizer step in
`<output_dir>/thundersync_trace/steps.jsonl`, held by one run at a time (see `TraceWriter`). Cheap: the records
already exist; writing is one `json.dumps` per step.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
from collections.abc import Sequence
from pathlib import Path

from ..errors import TraceInUseError
from ..streaming.flops import FlopCounter
from ..streaming.learner_records import BatchTiming, WorkItem
from ..types import Rollout, ScoredRollout
from .records import StepTrace, TraceEvent

# GRPO's WorkItem.kind → TraceEvent.kind on the learner lane (records.py lists them); the other kinds ("router_aux",
# distillation's "turn_backward" and "context_replay") are the trace's names already.
LEARNER_KINDS = {"trajectory": "source_backward", "content": "content_backward", "turn": "turn_backward",
                 "close": "turn_close", "bind": "bind", "group_fold": "group_fold"}
# Learner kinds that run a whole trajectory's forward + backward (their FLOPs count the full context).
WHOLE_TRAJECTORY_KINDS = ("source_backward", "content_backward")


def action_runs(env_mask: Sequence[int] | None, n_tokens: int) -> list[int]:
    """Lengths of the contiguous runs of model tokens (mask 1) of a completion: one per generated turn."""
    if env_mask is None:
        return [n_tokens] if n_tokens else []
    runs, current = [], 0
    for m in env_mask:
        if m:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    if current:
        runs.append(current)
    return runs


def rollout_events(rollouts: Sequence[Rollout | ScoredRollout]) -> list[TraceEvent]:
    """Per trajectory: its generation interval, each turn (request → action complete, with the turn's action tokens
    when the completion's env_mask splits into one run per turn), its tool calls, and, for a scored trajectory, its
    reward interval (finished → scored: grading and waiting for its reward call)."""
    events = []
    for item in rollouts:
        r = item.rollout if isinstance(item, ScoredRollout) else item
        events.append(TraceEvent("rollout", "trajectory", r.started_at, r.finished_at, r.index, r.group, -1,
                                 r.policy_version, None, len(r.completion_ids)))
        if r.agent is not None:
            runs = action_runs(r.env_mask, len(r.completion_ids))
            if len(runs) != len(r.agent.turn_intervals):
                runs = [0] * len(r.agent.turn_intervals)  # unknown split (0 tokens: the replay splits evenly)
            for turn, ((start, end), tokens) in enumerate(zip(r.agent.turn_intervals, runs, strict=True)):
                events.append(TraceEvent("rollout", "turn", start, end, r.index, r.group, turn, r.policy_version,
                                         tokens=tokens))
            for start, end in r.agent.tool_intervals:
                events.append(TraceEvent("tool", "tool_call", start, end, r.index, r.group, -1, r.policy_version))
        if isinstance(item, ScoredRollout) and item.scored_at > r.finished_at:
            events.append(TraceEvent("rollout", "reward", r.finished_at, item.scored_at, r.index, r.group, -1,
                                     r.policy_version, content_ready=r.finished_at, reward_at=item.scored_at))
    return events


def teacher_events(work: Sequence[WorkItem]) -> list[TraceEvent]:
    """The teacher lane, from the learner items' `TeacherInterval`s: one event per teacher request, its `ready` the
    earliest action end among the turns it scored (their queue wait). Under teacher_scoring="trajectory" one request
    scores several turns of a trajectory (the same interval): its event carries the last of them and the action
    tokens of all."""
    events: list[TraceEvent] = []
    requests: dict[tuple[int, float, float], int] = {}  # (trajectory, start, end) → its event
    for w in work:
        t = w.teacher
        if t is None:
            continue
        key = (w.index, t.start, t.end)
        if key in requests:
            k = requests[key]
            seen = events[k]
            events[k] = dataclasses.replace(seen, turn=max(seen.turn, w.turn), ready=min(seen.ready, t.queued),
                                            tokens=seen.tokens + w.tokens)
            continue
        requests[key] = len(events)
        events.append(TraceEvent("teacher", "teacher_score", t.start, t.end, w.index, w.group, w.turn,
                                 w.policy_version, t.queued, w.tokens))
    return events


def learner_events(work: Sequence[WorkItem], context_tokens: dict[int, int],
                   flops_of: FlopCounter | None) -> list[TraceEvent]:
    """One event per learner item. FLOPs: a whole-trajectory backward counts its trajectory's full context, a turn's
    backward (GRPO's "turn", distillation's "turn_backward") its own tokens, the rest (closes, replays, binds, folds,
    micro-batch terms) none."""
    events = []
    for w in work:
        kind = LEARNER_KINDS.get(w.kind, w.kind)
        if kind in WHOLE_TRAJECTORY_KINDS:
            tokens = context_tokens.get(w.index, 0)
        elif kind == "turn_backward":
            tokens = w.tokens
        else:
            tokens = 0
        flops = flops_of(tokens) if flops_of is not None and tokens else 0.0
        if w.flops is not None:  # priced by the learner: a pass over a shared prefix, or the prefix's own
            flops = w.flops
        events.append(TraceEvent("learner", kind, w.start, w.end, w.index, w.group, w.turn, w.policy_version, w.ready,
                                 w.tokens, flops, content_ready=w.content_ready, reward_at=w.reward_at))
    return events


def build_step_trace(*, step: int, schedule: str, timing: BatchTiming, work: Sequence[WorkItem],
                     rollouts: Sequence[Rollout | ScoredRollout], optimizer_end: float, publish_end: float,
                     stats_bytes: int = 0, flops_of: FlopCounter | None = None,
                     peak_flops_per_s: float = 0.0, plan_bytes: int = 0, peak_memory_bytes: int = 0) -> StepTrace:
    """One optimizer step as a `StepTrace`, for GRPO and distillation alike: the rollout lane (trajectories, turns,
    tool calls, and the reward interval of `ScoredRollout`s), the teacher lane (from the items' `TeacherInterval`s),
    the learner items with their FLOPs (`flops_of(tokens)`: one pass over a context of that many tokens,
    `streaming.flops`; None: no estimate), the barrier (from the last learner item or the rollout end, whichever is
    later, to `optimizer_end`) and the publication (`optimizer_end` → `publish_end`, absent when nothing was
    published). `plan_bytes` (the memory plan, a prediction) and `peak_memory_bytes` (measured) are recorded as
    given."""
    context = {}
    for item in rollouts:
        r = item.rollout if isinstance(item, ScoredRollout) else item
        context[r.index] = len(r.prompt_ids) + len(r.completion_ids)
    events = rollout_events(rollouts) + teacher_events(work) + learner_events(work, context, flops_of)
    learner_end = max((w.end for w in work), default=timing.rollout_end)
    barrier_start = max(learner_end, timing.rollout_end)
    events.append(TraceEvent("barrier", "optimizer", barrier_start, optimizer_end, policy_version=step))
    if publish_end > optimizer_end:
        events.append(TraceEvent("publish", "publish", optimizer_end, publish_end, policy_version=step + 1))
    return StepTrace(step=step, schedule=schedule, start=timing.start, rollout_end=timing.rollout_end,
                     learner_end=learner_end, barrier_end=optimizer_end, publish_end=publish_end,
                     events=tuple(events), stats_bytes=stats_bytes, peak_flops_per_s=peak_flops_per_s,
                     plan_bytes=plan_bytes, peak_memory_bytes=peak_memory_bytes)


def flop_metrics(trace: StepTrace, processes: int) -> dict[str, float]:
    """The step's learner FLOP rate from its trace (`thundersync/learner_tflops_per_s`) and, when the trace knows the
    device peak, the trainer's active MFU and the number of trainer processes it was measured on."""
    flops = sum(e.flops for e in trace.events)
    rate = flops / trace.wall if trace.wall else 0.0
    metrics = {"thundersync/learner_tflops_per_s": rate / 1e12}
    if trace.peak_flops_per_s:
        metrics["thundersync/trainer_active_mfu"] = rate / trace.peak_flops_per_s
        metrics["thundersync/trainer_processes"] = float(processes)
    return metrics


TRACE_FILE = Path("thundersync_trace") / "steps.jsonl"  # inside a run's output_dir


class TraceWriter:
    """Appends `StepTrace`s as JSON lines to one file, which it holds exclusively from construction to `close()`.

    Two live runs writing one trace would interleave their steps into a file no reader can tell apart, so opening
    takes an exclusive, non-blocking `flock` on the file and a second writer (in this process or another) fails
    with `TraceInUseError` naming the folder. The lock ends with `close()` or the process, so a later run on the
    same output_dir works: `fresh=True` (what a trainer passes unless it resumes from a checkpoint) then replaces
    the earlier run's steps, otherwise lines are appended after them.
    """

    def __init__(self, path: str | Path, *, fresh: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise TraceInUseError(f"{self.path} is being written by another live run") from None
        if fresh:
            self._file.truncate(0)  # only now, under the lock: never cut a file another run is writing

    def append(self, trace: StepTrace) -> None:
        if self._file.closed:
            raise ValueError(f"TraceWriter({self.path}) is closed")
        self._file.write(json.dumps(dataclasses.asdict(trace)) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Release the file (and its lock); idempotent."""
        self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_run_trace(args, is_main_process: bool, resume_from_checkpoint=None) -> TraceWriter | None:
    """The trace writer of one `train()` call: `<output_dir>/thundersync_trace/steps.jsonl` on the main process
    when `args.trace` is on, fresh unless the run resumes from a checkpoint (None otherwise)."""
    if not (args.trace and is_main_process):
        return None
    try:
        return TraceWriter(Path(args.output_dir) / TRACE_FILE, fresh=not resume_from_checkpoint)
    except TraceInUseError as exc:
        raise TraceInUseError(f"{exc}: two trainers cannot share output_dir={args.output_dir!r} at once; give each "
                              "run its own output_dir (or set trace=False)") from None
