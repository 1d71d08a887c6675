"""`shared_prefix` is on by default, for groups whose prompt has at least `shared_prefix_min_prompt_tokens` tokens."""

from __future__ import annotations

import pytest

from benchmarks.parity import cpu_config
from trl_thundersync import ThunderSyncGRPOConfig
from trl_thundersync.errors import ConfigurationError


def test_on_by_default_above_256_prompt_tokens(tmp_path):
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path)
    assert config.shared_prefix is True
    assert config.shared_prefix_min_prompt_tokens == 256


def test_the_threshold_is_at_least_one(tmp_path):
    assert cpu_config(ThunderSyncGRPOConfig, tmp_path, shared_prefix_min_prompt_tokens=1).shared_prefix
    with pytest.raises(ConfigurationError, match=r"shared_prefix_min_prompt_tokens=0 must be ≥ 1.*shared_prefix=False"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, shared_prefix_min_prompt_tokens=0)
