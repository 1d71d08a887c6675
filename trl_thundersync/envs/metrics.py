"""Moved to `trl_thundersync.envs.harness.metrics`: envs/ is split by layer, and this old path keeps working."""

from __future__ import annotations

from .harness.metrics import agent_metrics, completion_metrics, model_token_counts

__all__ = ["agent_metrics", "completion_metrics", "model_token_counts"]
