"""Both configs take the agent-loop fields from one mixin (`trainers/agent_config.py`): same fields, same defaults,
same help, one rule for the paper protocol's budgets left at None. The one intended difference is `agent_protocol`'s
default ('trl' for GRPO, 'paper' for GKD; the module docstring says why)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGRPOConfig
from trl_thundersync.errors import ConfigurationError
from trl_thundersync.trainers.agent_config import PAPER_AGENT_FIELDS, AgentLoopFields

AGENT_FIELDS = [f.name for f in dataclasses.fields(AgentLoopFields)]
PROTOCOL_DEFAULTS = {ThunderSyncGRPOConfig: "trl", ThunderSyncGKDConfig: "paper"}


def grpo(tmp_path, **overrides):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                num_generations=2)
    return ThunderSyncGRPOConfig(**{**base, **overrides})


def gkd(tmp_path, **overrides):
    return ThunderSyncGKDConfig(**{**dict(output_dir=str(tmp_path), use_cpu=True, report_to="none"), **overrides})


def test_the_mixin_holds_every_agent_loop_field():
    assert set(PAPER_AGENT_FIELDS) | {"agent_protocol", "agent_tool_timeout"} == set(AGENT_FIELDS)
    for cls in (ThunderSyncGRPOConfig, ThunderSyncGKDConfig):
        own = {f.name for f in dataclasses.fields(cls) if f.name.startswith("agent_")}
        assert own == set(AGENT_FIELDS), cls.__name__


@pytest.mark.parametrize("name", AGENT_FIELDS)
def test_grpo_and_gkd_share_each_agent_loop_field(name):
    grpo_field, gkd_field = ({f.name: f for f in dataclasses.fields(cls)}[name]
                             for cls in (ThunderSyncGRPOConfig, ThunderSyncGKDConfig))
    # resolved: HfArgumentParser (run by other tests) replaces a field's string annotation by the type it names
    grpo_type, gkd_type = (typing.get_type_hints(cls)[name] for cls in (ThunderSyncGRPOConfig, ThunderSyncGKDConfig))
    assert grpo_type == gkd_type
    assert grpo_field.metadata["help"] == gkd_field.metadata["help"]
    assert grpo_field.kw_only and gkd_field.kw_only
    if name == "agent_protocol":
        assert (grpo_field.default, gkd_field.default) == (PROTOCOL_DEFAULTS[ThunderSyncGRPOConfig],
                                                           PROTOCOL_DEFAULTS[ThunderSyncGKDConfig])
    else:
        assert grpo_field.default == gkd_field.default


def test_budgets_left_at_none_resolve_by_one_rule(tmp_path):
    from trl_thundersync.envs.harness.agent_loop import AgentLimits

    # GRPO: max_completion_length bounds the whole completion (TRL's GRPO), so the trajectory budget is it
    assert grpo(tmp_path, agent_protocol="paper", max_completion_length=40).agent_limits() == AgentLimits(
        max_turns=8, max_tokens_per_turn=40, max_completion_tokens=40, max_context_tokens=8192,
        max_observation_tokens=256, tool_timeout_s=60.0)
    # GKD: max_new_tokens bounds one generation (TRL's GKD), so the trajectory budget is turns × it
    assert gkd(tmp_path, max_new_tokens=40).agent_limits() == AgentLimits(
        max_turns=8, max_tokens_per_turn=40, max_completion_tokens=320, max_context_tokens=8192,
        max_observation_tokens=256, tool_timeout_s=60.0)
    given = dict(agent_max_turns=3, agent_max_tokens_per_turn=5, agent_max_completion_tokens=12,
                 agent_max_context_tokens=100, agent_max_observation_tokens=4, agent_tool_timeout=2.0)
    expected = AgentLimits(max_turns=3, max_tokens_per_turn=5, max_completion_tokens=12, max_context_tokens=100,
                           max_observation_tokens=4, tool_timeout_s=2.0)
    assert grpo(tmp_path, agent_protocol="paper", **given).agent_limits() == expected
    assert gkd(tmp_path, **given).agent_limits() == expected


@pytest.mark.parametrize("make, length_field", [(grpo, "max_completion_length"), (gkd, "max_new_tokens")])
def test_both_configs_check_the_agent_fields_alike(tmp_path, make, length_field):
    with pytest.raises(ConfigurationError, match="agent_max_observation_tokens=1 must be ≥ 2"):
        make(tmp_path, agent_protocol="paper", agent_max_observation_tokens=1)
    with pytest.raises(ConfigurationError, match="agent_tool_timeout=0 must be > 0"):
        make(tmp_path, agent_tool_timeout=0)
    with pytest.raises(ConfigurationError, match="agent_max_context_tokens=0"):
        make(tmp_path, agent_protocol="paper", agent_max_context_tokens=0)
    # under the TRL protocol every paper budget is refused once set, its default included (None is the default)
    with pytest.raises(ConfigurationError, match=f"agent_max_context_tokens=8192 is a budget of agent_protocol="
                                                 f"'paper'.*{length_field} \\(the whole multi-turn completion\\)"):
        make(tmp_path, agent_protocol="trl", agent_max_context_tokens=8192)
