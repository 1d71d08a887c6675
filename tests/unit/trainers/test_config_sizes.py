"""Sizes that cannot work are refused when the config is built, with a ConfigurationError naming the field."""

from __future__ import annotations

import pytest

from trl_thundersync import ThunderSyncGRPOConfig
from trl_thundersync.errors import ConfigurationError
from trl_thundersync.trainers.gkd.config import ThunderSyncGKDConfig


def grpo(tmp_path, **overrides):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                num_generations=2)
    return ThunderSyncGRPOConfig(**{**base, **overrides})


def gkd(tmp_path, **overrides):
    return ThunderSyncGKDConfig(**{**dict(output_dir=str(tmp_path), use_cpu=True, report_to="none"), **overrides})


@pytest.mark.parametrize("field, value", [
    ("max_completion_length", 0), ("max_completion_length", -3), ("max_completion_length", None),
    ("num_generations", 0), ("num_generations", None), ("per_device_train_batch_size", 0),
    ("gradient_accumulation_steps", 0), ("max_tool_calling_iterations", -1), ("vllm_max_model_length", 0),
])
def test_grpo_refuses_sizes_that_fail_later(tmp_path, field, value):
    with pytest.raises(ConfigurationError, match=f"{field}={value!r}"):
        grpo(tmp_path, **{field: value})


@pytest.mark.parametrize("field, value", [
    ("max_new_tokens", 0), ("max_new_tokens", None), ("max_length", 0), ("per_device_train_batch_size", 0),
    ("gradient_accumulation_steps", 0), ("agent_max_turns", 0), ("agent_max_tokens_per_turn", 0),
])
def test_gkd_refuses_sizes_that_fail_later(tmp_path, field, value):
    with pytest.raises(ConfigurationError, match=f"{field}={value!r}"):
        gkd(tmp_path, **{field: value})


def test_values_trl_gives_a_meaning_stay_accepted(tmp_path):
    # paper protocol: max_tool_calling_iterations=0 gives one turn, no tool call executed
    assert grpo(tmp_path, max_tool_calling_iterations=0, agent_protocol="paper").agent_limits().max_turns == 1
    # TRL protocol (default): the same meaning, kept as TRL's own field
    assert grpo(tmp_path, max_tool_calling_iterations=0).agent_limits().max_tool_calling_iterations == 0
    assert grpo(tmp_path, max_tool_calling_iterations=None).max_tool_calling_iterations is None
    assert grpo(tmp_path, max_completion_length=None, rollout_engine="trl").max_completion_length is None
    assert grpo(tmp_path, max_completion_length=1).agent_limits().max_tokens_per_turn == 1
    assert grpo(tmp_path, max_completion_length=1, agent_protocol="paper").agent_limits().max_tokens_per_turn == 1
    assert gkd(tmp_path, max_length=None).max_length is None


@pytest.mark.parametrize("field, value", [("agent_max_turns", 4), ("agent_max_tokens_per_turn", 32),
                                          ("agent_max_completion_tokens", 64), ("agent_max_context_tokens", 512),
                                          ("agent_max_observation_tokens", 16)])
def test_paper_budgets_are_refused_under_the_trl_protocol(tmp_path, field, value):
    with pytest.raises(ConfigurationError, match=f"{field}={value!r} is a budget of agent_protocol='paper'"):
        grpo(tmp_path, **{field: value})
    assert getattr(grpo(tmp_path, agent_protocol="paper", **{field: value}), field) == value


def test_agent_protocol_is_trl_by_default_and_checked(tmp_path):
    from trl_thundersync.envs.harness.agent_loop import AgentLimits
    from trl_thundersync.envs.harness.trl_tool_loop import TRLLoopLimits

    limits = grpo(tmp_path, max_completion_length=48, max_tool_calling_iterations=3).agent_limits()
    assert limits == TRLLoopLimits(max_completion_length=48, max_tool_calling_iterations=3)
    assert isinstance(grpo(tmp_path, agent_protocol="paper").agent_limits(), AgentLimits)
    with pytest.raises(ConfigurationError, match="agent_protocol='one_call'"):
        grpo(tmp_path, agent_protocol="one_call")


def test_gkd_keeps_the_paper_protocol_by_default_and_offers_trls(tmp_path):
    from trl_thundersync.envs.harness.agent_loop import AgentLimits
    from trl_thundersync.envs.harness.trl_tool_loop import TRLLoopLimits

    assert isinstance(gkd(tmp_path).agent_limits(), AgentLimits)
    limits = gkd(tmp_path, agent_protocol="trl", max_new_tokens=64, max_tool_calling_iterations=2).agent_limits()
    assert limits == TRLLoopLimits(max_completion_length=64, max_tool_calling_iterations=2)
    with pytest.raises(ConfigurationError, match="agent_max_turns=3 is a budget of agent_protocol='paper'"):
        gkd(tmp_path, agent_protocol="trl", agent_max_turns=3)
    with pytest.raises(ConfigurationError, match="max_tool_calling_iterations=2 applies to agent_protocol='trl'"):
        gkd(tmp_path, max_tool_calling_iterations=2)
    with pytest.raises(ConfigurationError, match="agent_protocol='both'"):
        gkd(tmp_path, agent_protocol="both")
