"""Moved to `trl_thundersync.envs.runtimes.api`: envs/ is split by layer, and this old path keeps working."""

from __future__ import annotations

from .runtimes.api import CommandResult, Sandbox, SandboxError, SandboxLimits

__all__ = ["CommandResult", "Sandbox", "SandboxError", "SandboxLimits"]
