"""Base of the task environments: one fresh workspace + sandbox per episode, the `run_shell`/`submit` tools.

TRL's `environment_factory` contract: the class is constructed without arguments, `reset(**row)` starts an
episode, `get_reward()` scores it, and every public method becomes a tool the model can call. So the only public
methods here are the two tools; `close` is a property (not a method) precisely so that TRL does not offer it to
the model as a tool, and every other helper is private.

Subclasses provide `_default_suite()`, `_prepare_workspace()`, `_setup_in_sandbox()` and `_grade()`.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import SandboxError, TaskSetupError, UnknownTaskError
from ..runtimes import make_sandbox
from ..runtimes.api import CommandResult, Sandbox, SandboxLimits
from ..runtimes.workspace import create_workspace, release_workspace
from ..tasks.grading import GradeReport

logger = logging.getLogger(__name__)

SUBMIT_ACTION = "submit"  # how a `submit` call is recorded in `ShellTaskEnv.actions`
SandboxFactory = Callable[[Path, SandboxLimits], Sandbox]  # (workspace, limits) -> a sandbox over that workspace


class ShellTaskEnv:
    """Shared episode lifecycle; see the module docstring. Not used directly."""

    kind = "task"  # short name used in workspace directory names and messages

    def __init__(
        self,
        tasks: Mapping[str, Any] | Iterable[Any] | None = None,
        *,
        limits: SandboxLimits | None = None,
        backend: str = "bwrap",
        sandbox_factory: SandboxFactory | None = None,
        grade_timeout_s: float = 180.0,
    ) -> None:
        self._tasks = None if tasks is None else _by_id(tasks)
        self.limits = limits or SandboxLimits()  # applied to every agent command
        self.backend = backend  # make_sandbox backend, used when no sandbox_factory is given
        self.grade_timeout_s = grade_timeout_s  # wall clock of one grading test run
        self._sandbox_factory = sandbox_factory
        self._sandbox: Sandbox | None = None
        self.task: Any = None  # the current task record (None before the first reset)
        self.workspace: Path | None = None  # host path of the current episode's workspace
        self._reset_episode_state()

    # ----------------------------------------------------------------------------------------- episode lifecycle

    def reset(self, **row: Any) -> str | None:
        """Start an episode for `row["task_id"]` in a fresh workspace; the prompt already holds the task."""
        self._release()
        task_id = row.get("task_id")
        tasks = self._task_map()
        if task_id not in tasks:
            raise UnknownTaskError(
                f"{type(self).__name__}.reset: unknown task_id {task_id!r} ({len(tasks)} tasks held)"
            )
        self.task = tasks[task_id]
        self._reset_episode_state()
        try:
            # As root a tmpfs capped at limits.workspace_bytes / workspace_inodes (see envs/runtimes/workspace.py).
            self.workspace = create_workspace(f"ts-{self.kind}-{task_id}-", self.limits)
        except (OSError, SandboxError) as exc:
            raise TaskSetupError(f"task {task_id}: could not create the workspace: {exc}") from exc
        try:
            self._prepare_workspace(self.workspace)
            self._sandbox = self._new_sandbox(self.workspace)
            self._setup_in_sandbox(self._sandbox)
        except (OSError, SandboxError) as exc:
            self._release()
            raise TaskSetupError(f"task {task_id}: could not prepare the workspace: {exc}") from exc
        except BaseException:
            self._release()
            raise
        return None

    def _reset_episode_state(self) -> None:
        self.done = False  # set by `submit`; the agent loop stops the episode when it is True
        self.infra_error: str | None = None  # infrastructure failure of this episode (then get_reward is None)
        self.num_commands = 0  # run_shell calls this episode
        self.tool_time_s = 0.0  # seconds spent inside the sandbox this episode
        self.last_result: CommandResult | None = None  # result of the latest run_shell command
        self.last_grade: GradeReport | None = None  # report of the latest get_reward
        self.actions: list[str] = []  # commands run_shell executed, then SUBMIT_ACTION: what record-graded suites grade
        self._reward_known = False

    # --------------------------------------------------------------------------------------------------- tools

    def run_shell(self, command: str) -> str:
        """Run a shell command in the task workspace (/workspace) and return its exit code and output.

        Args:
            command: The command line, run with /bin/sh -c in /workspace, for example "ls -la" or
                "python3 -m pytest -q". Use shell redirection or python3 to edit files.

        Returns:
            The exit code, stdout and stderr of the command; long output is shortened in the middle.
        """
        sandbox = self._require_sandbox("run_shell")
        if self.done:
            return "The task was already submitted; the command was not run."
        try:
            result = sandbox.run(command)
        except SandboxError as exc:
            self._record_infra(f"sandbox failed while running a command: {exc}")
            return f"Sandbox error (infrastructure, not caused by your command): {exc}"
        self.num_commands += 1
        self.actions.append(str(command))
        self.tool_time_s += result.duration_s
        self.last_result = result
        return format_observation(result)

    def submit(self) -> str:
        """Finish the task. Call this once, when your changes are complete; no command runs after it.

        Returns:
            A confirmation message.
        """
        self._require_sandbox("submit")
        self.done = True
        if SUBMIT_ACTION not in self.actions:
            self.actions.append(SUBMIT_ACTION)
        return "Submitted. The episode is over; your work will now be graded."

    # --------------------------------------------------------------------------------------------------- reward

    def get_reward(self) -> float | None:
        """Grade the episode (cached): a float for an attempt, None for an infrastructure failure (see infra_error)."""
        if self._reward_known:
            return self.last_grade.reward
        if self.workspace is None:
            raise TaskSetupError(f"{type(self).__name__}.get_reward() called before reset()")
        if self.infra_error is not None:
            report = GradeReport(reward=None, detail="episode had an infrastructure failure",
                                 infra_error=self.infra_error)
        else:
            try:
                report = self._grade()
            except (OSError, SandboxError, TaskSetupError) as exc:
                report = GradeReport(reward=None, detail="grading failed", infra_error=f"grading failed: {exc}")
        if report.infra_error is not None:
            self._record_infra(report.infra_error)
        self.last_grade, self._reward_known = report, True
        return report.reward

    # --------------------------------------------------------------------------------------------------- cleanup

    @property
    def close(self) -> Callable[[], None]:
        """`env.close()` releases the sandbox and workspace (idempotent). A property so TRL does not make it a tool."""
        return functools.partial(self._close)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close()

    def __del__(self) -> None:
        if hasattr(self, "_sandbox"):  # construction may have failed before the attributes existed
            self._close()

    def _close(self) -> None:
        try:
            self._release()
        finally:
            self._drop_caches()

    def _drop_caches(self) -> None:
        """Release what outlives one episode (subclasses with caches override)."""

    def _release(self) -> None:
        """End the current episode: close its sandbox and delete its workspace."""
        sandbox, self._sandbox = self._sandbox, None
        workspace, self.workspace = self.workspace, None
        try:
            if sandbox is not None:
                sandbox.close()
        finally:
            if workspace is not None:
                release_workspace(workspace)

    # --------------------------------------------------------------------------------------------------- helpers

    def _task_map(self) -> Mapping[str, Any]:
        if self._tasks is None:
            self._tasks = self._default_suite()
        return self._tasks

    def _new_sandbox(self, workspace: Path, limits: SandboxLimits | None = None) -> Sandbox:
        """A sandbox over `workspace` (default: the agent's limits) in which the task's answers are unreadable."""
        limits = self.limits if limits is None else limits
        if self._sandbox_factory is not None:
            return self._sandbox_factory(workspace, limits)
        kwargs = {"hidden_paths": self._answer_paths()} if self.backend == "bwrap" else {}
        return make_sandbox(workspace, limits=limits, backend=self.backend, **kwargs)

    def _answer_paths(self) -> tuple[Path, ...]:
        """Host paths of the task's answers (reference solution, hidden verifier), hidden from every sandbox even
        when they lie under a path the sandbox binds (a task suite installed under the interpreter's prefix)."""
        return ()

    def _require_sandbox(self, tool: str) -> Sandbox:
        if self._sandbox is None:
            raise TaskSetupError(f"{tool}() called before reset() (or after close())")
        return self._sandbox

    def _record_infra(self, message: str) -> None:
        task_id = getattr(self.task, "task_id", None)
        logger.warning("%s task %s: infrastructure error: %s", type(self).__name__, task_id, message)
        self.infra_error = message

    def _default_suite(self) -> Mapping[str, Any]:
        raise NotImplementedError

    def _prepare_workspace(self, workspace: Path) -> None:
        raise NotImplementedError

    def _setup_in_sandbox(self, sandbox: Sandbox) -> None:
        raise NotImplementedError

    def _grade(self) -> GradeReport:
        raise NotImplementedError


# Wall-clock durations that test runners print ("3 passed in 0.12s") change from run to run; masking them keeps
# observations, hence sampled trajectories, reproducible for a fixed seed (sync and thundersync runs compare equal).
_DURATION = re.compile(r"\bin \d+(?:\.\d+)?s\b")


def _mask_durations(text: str) -> str:
    return _DURATION.sub("in <elapsed>s", text)


def format_observation(result: CommandResult) -> str:
    """The text the model sees for one command."""
    if result.timed_out:
        status = "timed out (the command was killed)"
    elif result.exit_code is None:
        status = f"killed by signal {result.signal}"
    else:
        status = str(result.exit_code)
    parts = [f"exit_code: {status}"]
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            parts.append(f"{name}:\n{_mask_durations(text.rstrip())}")
    if result.truncated_bytes:
        parts.append(f"[{result.truncated_bytes} bytes of output were elided]")
    return "\n".join(parts)


def _by_id(tasks: Mapping[str, Any] | Iterable[Any]) -> Mapping[str, Any]:
    if isinstance(tasks, Mapping):
        return dict(tasks)
    return {task.task_id: task for task in tasks}
