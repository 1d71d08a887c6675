"""Moved to `trl_thundersync.envs.harness.tool_messages`: envs/ is split by layer, and this old path keeps working."""

from __future__ import annotations

from .harness.tool_messages import ToolMessagesRenderer

__all__ = ["ToolMessagesRenderer"]
