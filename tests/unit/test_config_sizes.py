"""Sizes that cannot work are refused when the config is built, with a ConfigurationError naming the field."""

from __future__ import annotations

import pytest

from trl_thundersync import ThunderSyncGRPOConfig
from trl_thundersync.errors import ConfigurationError
from trl_thundersync.trainers.gkd_config import ThunderSyncGKDConfig


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
    assert grpo(tmp_path, max_tool_calling_iterations=0).agent_limits().max_turns == 1  # no tool call executed
    assert grpo(tmp_path, max_tool_calling_iterations=None).max_tool_calling_iterations is None
    assert grpo(tmp_path, max_completion_length=None, rollout_engine="trl").max_completion_length is None
    assert grpo(tmp_path, max_completion_length=1).agent_limits().max_tokens_per_turn == 1
    assert gkd(tmp_path, max_length=None).max_length is None
