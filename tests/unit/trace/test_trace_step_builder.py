"""One step-trace builder for both learners (`trace.recorder.build_step_trace`): GRPO's work items with scored
trajectories, distillation's with their teacher lane; FLOPs on both; the metrics derived from a trace."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trl_thundersync.streaming.flops import ModelShape, flop_counter, learner_flops, model_flop_counter
from trl_thundersync.streaming.learner_records import BatchTiming, TeacherInterval, TeacherLoad, WorkItem
from trl_thundersync.trace.recorder import build_step_trace, flop_metrics
from trl_thundersync.types import AgentStats, Rollout, ScoredRollout

pytestmark = pytest.mark.fast

def agentic_rollout(index: int, group: int, start: float) -> Rollout:
    """Two turns of 2 and 3 action tokens around one tool call (2 tool tokens), after a 4-token prompt."""
    agent = AgentStats(turns=2, tool_calls=1, tool_failures=0, parse_errors=0, observation_truncations=0,
                       tool_intervals=((start + 1.0, start + 2.0),),
                       turn_intervals=((start, start + 1.0), (start + 2.0, start + 3.0)), wall_seconds=3.0,
                       stop_reason="answered")
    return Rollout(index=index, group=group, policy_version=5, prompt_ids=(1, 2, 3, 4),
                   completion_ids=(5, 6, 7, 8, 9, 10, 11), env_mask=(1, 1, 0, 0, 1, 1, 1), started_at=start,
                   finished_at=start + 3.0, agent=agent)


def test_grpo_items_give_rollout_reward_learner_barrier_and_publish_lanes_with_flops():
    scored = [ScoredRollout(agentic_rollout(0, 0, 0.0), (1.0,), 1.0, scored_at=3.5),
              ScoredRollout(agentic_rollout(1, 0, 0.5), (0.0,), 0.0, scored_at=3.5)]
    work = [WorkItem("content", 0, 0, 5, 3.0, 3.0, 3.4, 5, content_ready=3.0),
            WorkItem("trajectory", 1, 0, 5, 3.5, 3.5, 4.0, 5, content_ready=3.5, reward_at=3.5),
            WorkItem("bind", 0, 0, 5, 3.5, 4.0, 4.1, 0, content_ready=3.0, reward_at=3.5),
            WorkItem("group_fold", -1, 0, 5, 4.1, 4.1, 4.2, 0)]
    timing = BatchTiming(start=0.0, rollout_end=3.5, learner_busy=1.1, barrier=4.2, arrival_order=(0, 1))
    trace = build_step_trace(step=5, schedule="thundersync", timing=timing, work=work, rollouts=scored,
                             optimizer_end=4.5, publish_end=5.0, stats_bytes=128, flops_of=lambda tokens: 6.0 * tokens,
                             peak_flops_per_s=1e3)
    lanes = [e.lane for e in trace.events]
    assert lanes.count("rollout") == 2 * (1 + 2) + 1 and lanes.count("tool") == 2 and "teacher" not in lanes
    turns = [(e.index, e.turn, e.tokens) for e in trace.events if e.kind == "turn"]
    assert turns == [(0, 0, 2), (0, 1, 3), (1, 0, 2), (1, 1, 3)]  # each turn's action tokens
    rewards = [(e.index, e.start, e.end) for e in trace.events if e.kind == "reward"]
    assert rewards == [(0, 3.0, 3.5)]  # trajectory 1 was scored the moment it finished: no interval
    learner = [e for e in trace.events if e.lane == "learner"]
    assert [e.kind for e in learner] == ["content_backward", "source_backward", "bind", "group_fold"]
    assert [e.flops for e in learner] == [66.0, 66.0, 0.0, 0.0]  # whole trajectories: 4 + 7 context tokens
    (barrier,) = [e for e in trace.events if e.lane == "barrier"]
    (publish,) = [e for e in trace.events if e.lane == "publish"]
    assert (barrier.start, barrier.end, publish.start, publish.end) == (4.2, 4.5, 4.5, 5.0)
    assert (trace.step, trace.start, trace.rollout_end, trace.learner_end, trace.wall) == (5, 0.0, 3.5, 4.2, 5.0)
    assert (trace.stats_bytes, trace.peak_flops_per_s) == (128, 1e3)


def test_distillation_items_give_a_teacher_lane_one_event_per_request_and_flops():
    rollouts = [agentic_rollout(0, 0, 0.0), agentic_rollout(1, 1, 0.2)]
    per_turn = [TeacherInterval(queued=1.0, start=1.1, end=1.3), TeacherInterval(queued=3.0, start=3.2, end=3.4)]
    shared = TeacherInterval(queued=3.2, start=3.3, end=3.6)  # one request scored both turns of trajectory 1
    work = [WorkItem("turn_backward", 0, -1, 5, 1.3, 1.3, 1.5, 2, turn=0, teacher=per_turn[0]),
            WorkItem("turn_backward", 0, -1, 5, 3.4, 3.4, 3.6, 3, turn=1, teacher=per_turn[1]),
            WorkItem("turn_backward", 1, -1, 5, 3.6, 3.6, 3.7, 2, turn=0,
                     teacher=TeacherInterval(queued=1.2, start=shared.start, end=shared.end)),
            WorkItem("turn_backward", 1, -1, 5, 3.6, 3.7, 3.8, 3, turn=1, teacher=shared),
            WorkItem("context_replay", 0, -1, 5, 3.0, 3.8, 3.9, 9),
            WorkItem("context_replay", 1, -1, 5, 3.2, 3.9, 4.0, 9)]
    timing = BatchTiming(start=0.0, rollout_end=3.6, learner_busy=0.9, barrier=4.0, teacher_wait=0.6,
                         teacher=TeacherLoad(requests=3, prefill_tokens=40, busy_seconds=0.7))
    trace = build_step_trace(step=5, schedule="thundersync", timing=timing, work=work, rollouts=rollouts,
                             optimizer_end=4.3, publish_end=4.3, flops_of=lambda tokens: 6.0 * tokens)
    teacher = [(e.index, e.turn, e.start, e.end, e.ready, e.tokens) for e in trace.events if e.lane == "teacher"]
    assert teacher == [(0, 0, 1.1, 1.3, 1.0, 2), (0, 1, 3.2, 3.4, 3.0, 3),
                       (1, 1, 3.3, 3.6, 1.2, 5)]  # the shared request: its last turn, first queue entry, all tokens
    turns = [(e.index, e.turn, e.tokens) for e in trace.events if e.kind == "turn"]
    assert turns == [(0, 0, 2), (0, 1, 3), (1, 0, 2), (1, 1, 3)]
    learner = [e for e in trace.events if e.lane == "learner"]
    assert [e.kind for e in learner] == ["turn_backward"] * 4 + ["context_replay"] * 2
    assert [e.flops for e in learner] == [12.0, 18.0, 12.0, 18.0, 0.0, 0.0]  # a turn's own tokens; replays none
    assert not any(e.kind == "reward" for e in trace.events)  # plain rollouts: no reward interval
    assert [e.lane for e in trace.events][-1] == "barrier"  # nothing published: no publish event
    assert (trace.learner_end, trace.wall, trace.stats_bytes) == (4.0, 4.3, 0)
    assert timing.teacher_seconds == 0.7 and per_turn[0].wait == pytest.approx(0.1)
    assert per_turn[1].seconds == pytest.approx(0.2)


def test_a_batch_without_learner_items_starts_its_barrier_at_the_rollout_end():
    timing = BatchTiming(start=1.0, rollout_end=2.0, learner_busy=0.0, barrier=2.0)
    trace = build_step_trace(step=0, schedule="sync", timing=timing, work=[], rollouts=[], optimizer_end=2.5,
                             publish_end=2.5)
    assert [(e.lane, e.start, e.end) for e in trace.events] == [("barrier", 2.0, 2.5)]
    assert timing.teacher_seconds == 0.0 and timing.tail == 0.0


def trace_with_flops(flops: float, wall: float, peak: float):
    return SimpleNamespace(events=[SimpleNamespace(flops=flops / 2), SimpleNamespace(flops=flops / 2)], wall=wall,
                           peak_flops_per_s=peak)


def test_flop_metrics_give_the_learner_rate_and_with_a_peak_the_mfu():
    assert flop_metrics(trace_with_flops(4e12, 2.0, 0.0), processes=2) == {"thundersync/learner_tflops_per_s": 2.0}
    assert flop_metrics(trace_with_flops(4e12, 2.0, 4e12), processes=2) == {
        "thundersync/learner_tflops_per_s": 2.0, "thundersync/trainer_active_mfu": 0.5,
        "thundersync/trainer_processes": 2.0}
    assert flop_metrics(trace_with_flops(0.0, 0.0, 4e12), processes=1)["thundersync/trainer_active_mfu"] == 0.0


def decoder_config(**overrides):
    fields = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=100)
    return SimpleNamespace(**{**fields, **overrides})


def test_flop_counters_bind_the_model_shape_and_count_lora_adapters_only_with_peft():
    shape = ModelShape.from_config(decoder_config())
    assert flop_counter(decoder_config())(10) == learner_flops(shape, 10)
    assert flop_counter(decoder_config(), 500)(10) == learner_flops(shape, 10, 500)
    assert flop_counter(SimpleNamespace(hidden_size=8)) is None and flop_counter(None) is None
    adapter = [torch.nn.Parameter(torch.zeros(5, 10)), torch.nn.Parameter(torch.zeros(10))]
    full = SimpleNamespace(config=decoder_config())
    lora = SimpleNamespace(config=decoder_config(), peft_config={"default": None})
    assert model_flop_counter(full, adapter)(10) == learner_flops(shape, 10)
    assert model_flop_counter(lora, adapter)(10) == learner_flops(shape, 10, 60)
    assert model_flop_counter(SimpleNamespace(), adapter) is None
