"""String options are `Literal` aliases defined once; the configs' checks, the streaming tuples, the trace records and
the agent statistics all read them, so an option cannot be accepted in one place and refused in another.

Config fields: every `Literal`-typed field refuses a value outside its Literal, naming the field, the value and the
allowed values. Trace kinds and stop reasons are not checked at run time (old traces load as they are); instead the
strings the package writes are compared with their aliases here.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest

from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGRPOConfig
from trl_thundersync.errors import ConfigurationError
from trl_thundersync.trace.records import LearnerKind, TraceKind, TraceLane
from trl_thundersync.types import ReleasePoint, RewardScope, StopReason, TurnBackward

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = (ThunderSyncGRPOConfig, ThunderSyncGKDConfig)
# GKD accepts every RolloutEngine but TRL's own batch generation
ACCEPTED = {(ThunderSyncGKDConfig, "rollout_engine"): ("auto", "local_process", "local_thread", "embedded_server",
                                                        "vllm_server", "managed_vllm")}


def literal_fields(cls) -> dict[str, tuple]:
    hints = typing.get_type_hints(cls)
    return {f.name: typing.get_args(hints[f.name]) for f in dataclasses.fields(cls)
            if typing.get_origin(hints[f.name]) is typing.Literal}


def make(cls, tmp_path, **overrides):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    if cls is ThunderSyncGRPOConfig:
        base.update(per_device_train_batch_size=4, num_generations=2)
    return cls(**{**base, **overrides})


def test_the_string_options_are_literals():
    assert {"schedule", "release", "reward_scope", "agent_protocol", "rollout_engine",
            "vllm_weight_publisher"} <= set(literal_fields(ThunderSyncGRPOConfig))
    assert {"objective", "schedule", "turn_backward", "agent_protocol", "rollout_engine",
            "vllm_weight_publisher"} <= set(literal_fields(ThunderSyncGKDConfig))


LITERAL_FIELDS = [(cls, name) for cls in CONFIGS for name in literal_fields(cls)]


@pytest.mark.parametrize("cls, name", LITERAL_FIELDS, ids=[f"{cls.__name__}.{name}" for cls, name in LITERAL_FIELDS])
def test_every_literal_field_refuses_a_value_outside_it(tmp_path, cls, name):
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    options = literal_fields(cls)[name]
    allowed = ACCEPTED.get((cls, name), options)
    assert field.default in allowed and set(allowed) <= set(options)
    with pytest.raises(ConfigurationError, match="^" + re.escape(f"{name}='not_an_option' is not one of {allowed}")):
        make(cls, tmp_path, **{name: "not_an_option"})


def test_the_streaming_tuples_are_the_literals():
    from trl_thundersync.streaming.release import RELEASE_POINTS
    from trl_thundersync.streaming.reward_scope import REWARD_SCOPES
    from trl_thundersync.streaming.turn_grpo import TURN_BACKWARDS
    from trl_thundersync.trainers.gkd.config import TURN_BACKWARDS as GKD_TURN_BACKWARDS

    assert RELEASE_POINTS == typing.get_args(ReleasePoint) == ("reward", "content", "turn")
    assert REWARD_SCOPES == typing.get_args(RewardScope) == ("auto", "trajectory", "group", "batch")
    assert TURN_BACKWARDS == typing.get_args(TurnBackward) == ("boundary_cut", "naive")
    assert GKD_TURN_BACKWARDS == ("auto", *TURN_BACKWARDS)  # GKD's field resolves "auto" to one of them


def package_trees() -> list[ast.Module]:
    roots = [ROOT / "trl_thundersync", ROOT / "benchmarks"]
    return [ast.parse(path.read_text()) for root in roots if root.is_dir() for path in sorted(root.rglob("*.py"))]


def constant_arguments(trees, callee: str, position: int, keyword: str) -> set[str]:
    """The string constants passed to `callee(...)` at `position` or as `keyword=`."""
    found = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == callee:
                args = node.args[position:position + 1] + [k.value for k in node.keywords if k.arg == keyword]
                found.update(a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return found


def test_trace_lanes_and_kinds_written_are_the_literals():
    from trl_thundersync.trace.recorder import LEARNER_KINDS

    trees = package_trees()
    assert constant_arguments(trees, "TraceEvent", 0, "lane") == set(typing.get_args(TraceLane))
    written = constant_arguments(trees, "WorkItem", 0, "kind")  # a learner item's kind, as its trace event names it
    learner = set(LEARNER_KINDS.values()) | {LEARNER_KINDS.get(kind, kind) for kind in written}
    assert learner <= set(typing.get_args(LearnerKind))
    kinds = constant_arguments(trees, "TraceEvent", 1, "kind") | learner
    assert kinds == set(typing.get_args(TraceKind))


def test_stop_reasons_written_are_the_literal():
    reasons = set()
    for tree in package_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "stop" for t in node.targets):
                reasons.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                               and isinstance(c.value, str))
    assert reasons == set(typing.get_args(StopReason))
