"""Runtimes: where an agent's commands run. The `Sandbox` protocol, its backends, and what they share.

    from trl_thundersync.envs.runtimes import SandboxLimits, make_sandbox
    sandbox = make_sandbox(workspace, SandboxLimits(timeout_s=10))       # bubblewrap
    result = sandbox.run("python3 -m pytest -q")                          # a CommandResult, never an exception

- `api.py`: the contract (`Sandbox`, `SandboxLimits`, `CommandResult`); `SandboxError` is in `envs/errors.py`.
- `bwrap.py`: `BwrapSandbox`, the isolating backend (its docstring lists what it protects against), with
  `mounts.py` (what it binds and covers) and `cgroup.py` (per-command pids and memory cgroups, as root).
- `local.py`: `LocalSubprocessSandbox`, an UNSANDBOXED host-subprocess fallback for tests and development.
- `launcher.py` (rlimits, the command from a memfd, /bin/sh) and `process_io.py` (bounded output capture, stdin,
  waiting, killing): shared by both backends.
- `workspace.py`: task workspaces with a disk quota (`create_workspace`, `release_workspace`, `remove_path`).
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigurationError
from ..errors import SandboxError
from .api import CommandResult, Sandbox, SandboxLimits

__all__ = ["CommandResult", "Sandbox", "SandboxError", "SandboxLimits", "make_sandbox"]


def make_sandbox(
    workspace: str | Path, limits: SandboxLimits = SandboxLimits(), backend: str = "bwrap", **kwargs: object
) -> Sandbox:
    """Build a sandbox by backend name; `kwargs` go to the backend's constructor (for bwrap: workdir, ...)."""
    if backend == "bwrap":
        from .bwrap import BwrapSandbox  # imported on first use: environments need the backend only per episode

        return BwrapSandbox(workspace, limits, **kwargs)  # type: ignore[arg-type]
    if backend == "docker":
        raise SandboxError("Docker backend not available here: only backend='bwrap' is implemented")
    raise ConfigurationError(f"backend={backend!r} is not a sandbox backend: use 'bwrap'")
