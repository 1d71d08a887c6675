"""Moved to `trl_thundersync.envs.harness.trl_tool_loop`: envs/ is split by layer, and this old path keeps working."""

from __future__ import annotations

from .harness.trl_tool_loop import TRLLoopLimits, execute_turn, parse_trl_turn, run_trl_trajectory

__all__ = ["TRLLoopLimits", "execute_turn", "parse_trl_turn", "run_trl_trajectory"]
