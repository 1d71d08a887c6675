"""Moved to `trl_thundersync.envs.environments.swe`: envs/ is split by layer, and this old path keeps working."""

from __future__ import annotations

from .environments.swe import SWERepairEnv

__all__ = ["SWERepairEnv"]
