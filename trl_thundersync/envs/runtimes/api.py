"""The sandbox contract: run one shell command for an agent, isolated, bounded, and always answered.

A `Sandbox` runs commands inside one task workspace (a host directory that is the only writable place). Backends
(bubblewrap here; Docker for production images) implement the same protocol, so environments never know which one
runs their commands. A command never raises for what the *command* did (non-zero exit, timeout, killed for memory,
too much output, too long a command): that is all in the `CommandResult` the model will see. `SandboxError`
(`envs/errors.py`) is for infrastructure failures only (the backend is missing, the workspace is gone), which must
never be mistaken for a failed attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..errors import SandboxError

__all__ = ["CommandResult", "Sandbox", "SandboxError", "SandboxLimits"]  # SandboxError lives in envs/errors.py


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits applied to every command (paper Table 6 style budgets)."""

    timeout_s: float = 30.0  # wall clock; the whole process tree is killed when it expires
    cpu_time_s: int = 60  # RLIMIT_CPU per process
    memory_bytes: int = 1 << 30  # RLIMIT_AS per process
    max_processes: int = 64  # RLIMIT_NPROC (contains fork bombs)
    max_file_bytes: int = 64 << 20  # RLIMIT_FSIZE: largest file a command may write
    output_bytes: int = 16 << 10  # captured stdout+stderr kept per stream: head and tail halves, middle elided
    network: bool = False  # False: a private network namespace with loopback only
    # Memory of the whole command tree (all processes, their page cache, /tmp and /dev/shm), capped by a per-command
    # memory cgroup with no swap (as root); the kernel OOM-kills inside the tree beyond it. None: not enforced.
    tree_memory_bytes: int | None = 2 << 30
    max_command_bytes: int = 4 << 20  # longest command (UTF-8) run; a longer one is answered with exit code 126
    # Size and file count of the task workspace: ShellTaskEnv mounts it as a tmpfs with these caps (as root; RAM/swap
    # backed), so the agent's writes fail with ENOSPC beyond them. None: no cap (a plain host directory).
    workspace_bytes: int | None = 1 << 30
    workspace_inodes: int | None = 100_000


@dataclass(frozen=True)
class CommandResult:
    """What one command did. Text fields are already bounded by `SandboxLimits.output_bytes`."""

    command: str
    exit_code: int | None  # None when killed (timeout, signal)
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated_bytes: int = 0  # bytes of output elided in the middle (stdout + stderr)
    signal: int | None = None  # terminating signal, if any
    oom_kills: int = 0  # processes the kernel killed because the tree exceeded `SandboxLimits.tree_memory_bytes`

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    """One workspace, many commands. Lifecycle: create → run()* → close()."""

    workspace: Path  # host path of the writable workspace (mounted at `workdir` inside)
    workdir: str  # path of the workspace as commands see it (e.g. "/workspace")

    def run(
        self, command: str, *, timeout_s: float | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        """Run `command` with /bin/sh in the workspace; never raises for the command's own failures.

        `stdin`: bytes fed to the command's standard input, then end of file (None: an empty stdin, /dev/null).
        """
        ...

    def close(self) -> None:
        """Kill anything still running and release the workspace (idempotent)."""
        ...
