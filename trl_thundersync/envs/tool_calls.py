"""Moved to `trl_thundersync.envs.harness.tool_calls`: envs/ is split by layer, and this old path keeps working."""

from __future__ import annotations

from .harness.tool_calls import (
    PARSE_FAILURES,
    PARSER_ERROR_OBSERVATION,
    ParsedTurn,
    ToolResponseRenderer,
    format_tool_result,
    parse_turn,
    truncate_observation,
)

__all__ = [
    "PARSER_ERROR_OBSERVATION", "PARSE_FAILURES", "ParsedTurn", "ToolResponseRenderer", "format_tool_result",
    "parse_turn", "truncate_observation",
]
