"""Typed errors of the task suites: a malformed task or row, an unknown task id, a task that cannot be set up."""

from __future__ import annotations

from ...errors import ThunderSyncError


class TaskFormatError(ThunderSyncError, ValueError):
    """A task file or a SWE-bench style row is malformed (the message names the task or row and the field)."""


class UnknownTaskError(ThunderSyncError, KeyError):
    """`reset(task_id=...)` named a task the environment does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class TaskSetupError(ThunderSyncError):
    """A task's workspace could not be prepared (copy failed, a setup command failed): the task or host is broken."""
