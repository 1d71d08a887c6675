"""Moved to `trl_thundersync.envs.harness.agent_loop`: envs/ is split by layer, and this old path keeps working."""

from __future__ import annotations

from .harness.agent_loop import AgentLimits, AgentTrajectory, GenerateFn, ToolRunner, run_agent_trajectory, turn_event

__all__ = ["AgentLimits", "AgentTrajectory", "GenerateFn", "ToolRunner", "run_agent_trajectory", "turn_event"]
