"""Moved to `trl_thundersync.envs.environments.terminal`: envs/ is split by layer, and this old path keeps working."""

from __future__ import annotations

from .environments.terminal import TerminalTaskEnv

__all__ = ["TerminalTaskEnv"]
