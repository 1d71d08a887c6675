"""Moved to `trl_thundersync.envs.runtimes` (`make_sandbox`; the bubblewrap backend is `runtimes/bwrap.py`, whose
docstring lists what the sandbox protects against): envs/ is split by layer, and this old path keeps working."""

from __future__ import annotations

from .runtimes import CommandResult, Sandbox, SandboxError, SandboxLimits, make_sandbox
from .runtimes.bwrap import SANDBOX_UID, BwrapSandbox

__all__ = ["SANDBOX_UID", "BwrapSandbox", "CommandResult", "Sandbox", "SandboxError", "SandboxLimits", "make_sandbox"]
