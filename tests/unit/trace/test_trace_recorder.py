"""The step-trace file belongs to one live run: a second writer is refused, a later run replaces or appends."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from trl_thundersync.errors import TraceInUseError
from trl_thundersync.trace.export import read_jsonl
from trl_thundersync.trace.recorder import TRACE_FILE, TraceWriter, open_run_trace
from trl_thundersync.trace.records import StepTrace, TraceEvent


def step(n: int, schedule: str = "sync") -> StepTrace:
    return StepTrace(step=n, schedule=schedule, start=0.0, rollout_end=1.0, learner_end=1.5, barrier_end=2.0,
                     publish_end=2.0, events=(TraceEvent("barrier", "optimizer", 1.5, 2.0, policy_version=n),))


def test_two_writers_at_once_on_one_trace_are_refused(tmp_path):
    path = tmp_path / TRACE_FILE
    first = TraceWriter(path)
    first.append(step(0))
    with pytest.raises(TraceInUseError, match="being written by another live run"):
        TraceWriter(path)
    first.append(step(1))  # the refused writer did not disturb the live one
    first.close()
    assert [s.step for s in read_jsonl(path)] == [0, 1]


def test_a_run_in_another_process_holds_the_trace(tmp_path):
    path = tmp_path / TRACE_FILE
    path.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); sys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TraceInUseError):
            TraceWriter(path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with TraceWriter(path) as writer:  # that run ended: its lock went with it
        writer.append(step(0))
    assert len(read_jsonl(path)) == 1


def test_a_later_run_replaces_the_trace_and_a_resumed_one_appends(tmp_path):
    args = SimpleNamespace(trace=True, output_dir=str(tmp_path))
    for run in range(2):  # e.g. the quickstart run twice into one output_dir
        writer = open_run_trace(args, is_main_process=True)
        writer.append(step(0, schedule=f"run{run}"))
        writer.append(step(1, schedule=f"run{run}"))
        writer.close()
        assert [(s.schedule, s.step) for s in read_jsonl(tmp_path / TRACE_FILE)] == [(f"run{run}", 0), (f"run{run}", 1)]
    resumed = open_run_trace(args, is_main_process=True, resume_from_checkpoint=True)
    resumed.append(step(2, schedule="run1"))
    resumed.close()
    assert [s.step for s in read_jsonl(tmp_path / TRACE_FILE)] == [0, 1, 2]


def test_the_refusal_names_output_dir_and_leaves_the_live_trace_alone(tmp_path):
    args = SimpleNamespace(trace=True, output_dir=str(tmp_path))
    live = open_run_trace(args, is_main_process=True)
    live.append(step(0))
    with pytest.raises(TraceInUseError, match=f"output_dir={str(tmp_path)!r}"):
        open_run_trace(args, is_main_process=True)  # fresh, but must not truncate the live run's file
    live.close()
    assert len(read_jsonl(tmp_path / TRACE_FILE)) == 1


def test_no_trace_no_lock(tmp_path):
    assert open_run_trace(SimpleNamespace(trace=False, output_dir=str(tmp_path)), True) is None
    assert open_run_trace(SimpleNamespace(trace=True, output_dir=str(tmp_path)), False) is None
    assert not (tmp_path / TRACE_FILE).exists()


def test_a_closed_writer_refuses_to_append(tmp_path):
    writer = TraceWriter(tmp_path / TRACE_FILE)
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        writer.append(step(0))


def test_learner_events_carry_content_and_reward_times_and_name_every_release_kind():
    from trl_thundersync.streaming.learner_records import WorkItem
    from trl_thundersync.trace.recorder import learner_events

    work = [WorkItem("trajectory", 0, 0, 3, 2.0, 2.0, 2.5, 7, content_ready=1.0, reward_at=2.0),
            WorkItem("content", 1, 0, 3, 1.5, 2.5, 3.0, 8, content_ready=1.5),
            WorkItem("turn", 2, 1, 3, 0.7, 3.0, 3.1, 4, turn=1),
            WorkItem("close", 2, 1, 3, 1.8, 3.1, 3.2, 9, content_ready=1.8),
            WorkItem("bind", 1, 0, 3, 2.9, 3.2, 3.3, 0, content_ready=1.5, reward_at=2.9),
            WorkItem("group_fold", -1, 0, 3, 3.3, 3.3, 3.4, 0)]
    events = learner_events(work, {0: 100, 1: 120, 2: 90}, lambda tokens: 6.0 * tokens)
    assert [e.kind for e in events] == ["source_backward", "content_backward", "turn_backward", "turn_close", "bind",
                                        "group_fold"]
    assert [(e.content_ready, e.reward_at) for e in events] == [(1.0, 2.0), (1.5, None), (None, None), (1.8, None),
                                                                (1.5, 2.9), (None, None)]
    assert [e.flops for e in events] == [600.0, 720.0, 24.0, 0.0, 0.0, 0.0]  # whole trajectories: full context
    assert events[2].turn == 1 and events[0].ready == 2.0


def test_rollout_events_show_turn_action_tokens_and_the_reward_interval():
    from trl_thundersync.trace.recorder import action_runs, rollout_events
    from trl_thundersync.types import AgentStats, Rollout, ScoredRollout

    assert action_runs([1, 1, 0, 0, 1, 1, 1, 0], 8) == [2, 3] and action_runs(None, 5) == [5]
    agent = AgentStats(turns=2, tool_calls=1, tool_failures=0, parse_errors=0, observation_truncations=0,
                       tool_intervals=((1.0, 2.0),), turn_intervals=((0.0, 1.0), (2.0, 3.0)), wall_seconds=3.0,
                       stop_reason="answered")
    rollout = Rollout(index=4, group=2, policy_version=0, prompt_ids=(1,), completion_ids=(5, 6, 7, 8, 9, 10),
                      env_mask=(1, 1, 0, 0, 1, 1), started_at=0.0, finished_at=3.0, agent=agent)
    events = rollout_events([ScoredRollout(rollout, (0.5,), 0.5, scored_at=4.5)])
    turns = [e for e in events if e.kind == "turn"]
    assert [(e.turn, e.tokens, e.start, e.end) for e in turns] == [(0, 2, 0.0, 1.0), (1, 2, 2.0, 3.0)]
    reward = [e for e in events if e.kind == "reward"]
    assert [(e.start, e.end, e.content_ready, e.reward_at) for e in reward] == [(3.0, 4.5, 3.0, 4.5)]
