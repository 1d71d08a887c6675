"""Typed errors of the agentic environments, in one place: the sandbox (runtimes) and the task suites.

Which one means what, and who must act:

- `SandboxError`: the sandbox itself failed (missing backend, broken workspace, a cgroup or mount it needs): an
  infrastructure error, never a failed attempt. A command's own failures are never errors (`CommandResult`).
- `TaskFormatError`: a task file or a SWE-bench style row is malformed (also a `ValueError`).
- `UnknownTaskError`: `reset(task_id=...)` named a task the environment does not hold (also a `KeyError`).
- `TaskSetupError`: a task's workspace could not be prepared: the task or the host is broken.
- `UngradableWorkspace`: the agent's workspace is over the grading limits: the *attempt* failed (reward 0.0).

They are also importable from the layers that raise them (`envs.runtimes`, `envs.runtimes.api`, `envs.tasks`,
`envs.tasks.grading`). Errors of the trainers, the rollout side and configuration live in `trl_thundersync.errors`,
whose `ThunderSyncError` is the base of all of these.
"""

from __future__ import annotations

from ..errors import ThunderSyncError


class SandboxError(ThunderSyncError):
    """The sandbox itself failed (missing backend, broken workspace): an infrastructure error, not an attempt."""


class TaskFormatError(ThunderSyncError, ValueError):
    """A task file or a SWE-bench style row is malformed (the message names the task or row and the field)."""


class UnknownTaskError(ThunderSyncError, KeyError):
    """`reset(task_id=...)` named a task the environment does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class TaskSetupError(ThunderSyncError):
    """A task's workspace could not be prepared (copy failed, a setup command failed): the task or host is broken."""


class UngradableWorkspace(ThunderSyncError):
    """The attempt's workspace is over the grading limits (entries, bytes, path length, copy time): a failed
    attempt (reward 0.0), since only the agent's own commands could have made it so."""
