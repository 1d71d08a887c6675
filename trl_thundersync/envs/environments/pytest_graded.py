"""`PytestGradedEnv`: the part of the SWE and terminal environments that grades an attempt with one pytest run.

Each grading run happens in a fresh private host directory (the "grading copy"), populated by the caller (the
agent's workspace, copied within `GradingLimits`, or a trusted reference tree), inside a fresh sandbox over that
copy, through the grading runner (`pytest_channel.run_pytest`): outcomes come only from its authenticated records.
The whole run — copying included — fits in one time budget (`grade_timeout_s`); the deadline is passed down.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..runtimes.api import Sandbox
from ..runtimes.workspace import create_workspace, release_workspace
from ..tasks.grading import GradingLimits, UngradableWorkspace, copy_workspace
from ..tasks.pytest_channel import PytestRun, run_pytest
from .shell_env import ShellTaskEnv

# Output kept per stream of a grading run: the channel carries ~100 bytes per test, so this holds tens of
# thousands of tests; the sandbox keeps head and tail halves, and a record cut by elision is rejected, not misread.
GRADING_OUTPUT_BYTES = 4 << 20


class PytestGradedEnv(ShellTaskEnv):
    """Shared grading machinery of `SWERepairEnv` and `TerminalTaskEnv`; not used directly.

    Keyword argument (besides ShellTaskEnv's): `grading_limits` (GradingLimits: entries, bytes and path length of
    the workspace copy made for grading; over them the attempt fails with reward 0.0).
    """

    def __init__(self, tasks: Mapping[str, Any] | Iterable[Any] | None = None, *,
                 grading_limits: GradingLimits | None = None, **kwargs: Any) -> None:
        self.grading_limits = grading_limits or GradingLimits()
        super().__init__(tasks, **kwargs)

    def _deadline(self) -> float:
        """The time.monotonic() by which one grading run, copying included, must be over."""
        return time.monotonic() + self.grade_timeout_s

    def _copy_attempt(self, copy: Path, deadline: float) -> None:
        """The agent's workspace into the grading copy, bounded (raises UngradableWorkspace)."""
        copy_workspace(self.workspace, copy, self.grading_limits, deadline)

    def _run_in_copy(self, populate: Callable[[Path], None], args: tuple[str, ...], *, deadline: float,
                     **run_options: Any) -> PytestRun:
        """Populate a fresh grading copy, then run pytest with `args` over it until `deadline`."""
        # the graded code writes into the copy too: as root it gets the workspace's disk quota (workspace.py)
        copy = create_workspace(f"ts-{self.kind}-grade-{self.task.task_id}-", self.limits)
        sandbox = None
        try:
            populate(copy)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise UngradableWorkspace("preparing the grading copy took the whole grading time budget")
            sandbox = self._grading_sandbox(copy)
            return run_pytest(sandbox, args, timeout_s=remaining, **run_options)
        finally:
            try:
                if sandbox is not None:
                    sandbox.close()
            finally:
                release_workspace(copy)

    def _grading_sandbox(self, copy: Path) -> Sandbox:
        """A sandbox over the grading copy: the agent's limits, with room for the channel's records."""
        limits = dataclasses.replace(self.limits, output_bytes=max(self.limits.output_bytes, GRADING_OUTPUT_BYTES))
        return self._new_sandbox(copy, limits)
