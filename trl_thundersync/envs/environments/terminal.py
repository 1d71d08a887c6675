"""`TerminalTaskEnv`: SETA / Terminal-Bench style shell tasks graded by a hidden pytest verifier.

    from trl_thundersync.envs.environments import TerminalTaskEnv
    from trl_thundersync.envs.tasks import terminal_dataset
    trainer = GRPOTrainer(..., train_dataset=terminal_dataset(), environment_factory=TerminalTaskEnv)

Verifier design: each task ships `test_outputs.py`, a pytest file whose test functions are the named checks. The
agent never sees it, not even while the checks run its programs: the verifier never enters the workspace. At
grading, a fresh host copy of the workspace (within `GradingLimits`, inside `grade_timeout_s`) is the sandbox's
/workspace; the grading runner (`tasks.pytest_channel`) receives the verifier source on stdin, writes it and an
empty pytest.ini into a private directory of the sandbox's /tmp, and deletes both as soon as pytest has collected
the checks, before any check runs. pytest runs with `python3 -I` (the workspace is not on sys.path),
`--import-mode=importlib` (nor is the verifier's directory), `--noconftest` and `-c` that pytest.ini, so nothing
the agent wrote can configure or hijack the run; the runner's process is not dumpable, so the agent's programs
(started by the checks, same uid) cannot read it through /proc. Outcomes come only from the runner's authenticated
records; nothing the agent's programs print, write or take off a pipe can make one. Tests find the task files in the
current directory (the workspace).

Reward (SETA): p = passed checks / all checks, reward = p + 0.5 * (p == 1). A check that raises (file missing,
wrong content, the agent's script timing out inside `subprocess.run(..., timeout=...)`) is a failed check. When
the run does not report every check normally (pytest exit 2-5, an ERROR in a check's setup or teardown, the run
cut short or timed out, no checks), the reference solution (setup, then `solution.sh`) is graded the same way in a
fresh workspace: if it earns the full reward, the attempt caused the failure and is scored on the reference's
checks, each one without a PASSED outcome failed; if it does not, the verifier is broken: get_reward returns None
and sets `infra_error`. A workspace over the grading limits is a failed attempt (0.0).
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ..errors import TaskSetupError
from ..runtimes.api import Sandbox
from ..tasks.grading import (
    PYTEST_REPORT_FLAGS,
    GradeReport,
    UngradableWorkspace,
    copy_task_files,
    copy_tree,
    remove_path,
    seta_reward,
    tail,
)
from ..tasks.pytest_channel import PytestRun
from ..tasks.records import TerminalTask
from ..tasks.suites import load_terminal_suite
from .pytest_graded import PytestGradedEnv

_VERIFY_ARGS = (
    "-q", "-p", "no:cacheprovider", "--noconftest", "--import-mode=importlib", "-c", "{files}/pytest.ini",
    "--rootdir", "{files}", *PYTEST_REPORT_FLAGS, "{files}/test_outputs.py",
)  # "{files}": the runner's private directory holding the verifier

# Check ids of each task's verifier, seen when its reference solution earned the full reward; shared by all
# instances. Only successes are cached, so a transient failure is retried next time.
_REFERENCE_CHECKS: dict[tuple[str, str], tuple[str, ...]] = {}
_REFERENCE_LOCK = threading.Lock()


class TerminalTaskEnv(PytestGradedEnv):
    """Terminal task environment over a mapping of `TerminalTask`s (default: the bundled suite).

    Keyword arguments (all optional): `tasks` (mapping or iterable of TerminalTask), `limits` (SandboxLimits for
    agent and setup commands), `backend` (make_sandbox backend, default "bwrap"), `sandbox_factory` ((workspace,
    limits) -> Sandbox, overrides backend), `grade_timeout_s` (wall clock of the verifier run, copying included),
    `grading_limits` (GradingLimits of the workspace copy made for grading).
    """

    kind = "terminal"

    def __init__(self, tasks: Mapping[str, TerminalTask] | Iterable[TerminalTask] | None = None, **kwargs) -> None:
        super().__init__(tasks, **kwargs)

    def _default_suite(self) -> Mapping[str, TerminalTask]:
        return load_terminal_suite()

    def _answer_paths(self) -> tuple[Path, ...]:
        return (self.task.verifier_file,)

    def _prepare_workspace(self, workspace: Path) -> None:
        if self.task.files_dir is not None:
            copy_task_files(self.task.files_dir, workspace)

    def _setup_in_sandbox(self, sandbox: Sandbox) -> None:
        for command in self.task.setup:
            result = sandbox.run(command)
            if not result.ok:
                raise TaskSetupError(
                    f"task {self.task.task_id}: setup command {command!r} failed (exit {result.exit_code}, "
                    f"timed out: {result.timed_out}): {result.stderr[-800:]}"
                )

    def _grade(self) -> GradeReport:
        deadline = self._deadline()
        try:
            run = self._verify(lambda copy: self._copy_attempt(copy, deadline), deadline)
        except UngradableWorkspace as exc:
            return GradeReport(reward=0.0, detail=f"the workspace cannot be graded: {exc}")
        problem = _run_problem(run)
        if problem is None:
            return _score(run, run.collected, "")
        checks = self._reference_checks()
        if isinstance(checks, str):
            return GradeReport(reward=None, detail="infrastructure error", outcomes=dict(run.outcomes),
                               exit_code=run.exit_status, log_tail=tail(run.log),
                               infra_error=f"the verifier is broken: {problem} for the attempt, and the reference "
                                           f"solution does not earn the full reward either ({checks})")
        return _score(run, checks, f" ({problem}; the reference solution passes every check)")

    def _verify(self, populate: Callable[[Path], None], deadline: float) -> PytestRun:
        """Run the hidden verifier over a freshly populated grading copy."""
        try:
            source = self.task.verifier_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TaskSetupError(f"task {self.task.task_id}: cannot read the verifier: {exc}") from exc
        return self._run_in_copy(populate, _VERIFY_ARGS, deadline=deadline, hide_files=True,
                                 files={"test_outputs.py": source, "pytest.ini": "[pytest]\n"})

    def _reference_checks(self) -> tuple[str, ...] | str:
        """The verifier's check ids when the reference solution earns the full reward, else what went wrong."""
        key = (self.task.task_id, str(self.task.verifier_file))
        with _REFERENCE_LOCK:
            if key in _REFERENCE_CHECKS:
                return _REFERENCE_CHECKS[key]
        workspace = Path(tempfile.mkdtemp(prefix=f"ts-terminal-reference-{self.task.task_id}-"))
        try:
            self._prepare_workspace(workspace)
            sandbox = self._new_sandbox(workspace)
            try:
                self._setup_in_sandbox(sandbox)
                solution = sandbox.run(self.task.solution_script)
            finally:
                sandbox.close()
            run = self._verify(lambda copy: copy_tree(workspace, copy), self._deadline())
        except UngradableWorkspace as exc:  # the reference tree took the whole budget to copy: the task is broken
            return f"reference run: {exc}"
        finally:
            remove_path(workspace)
        problem = _run_problem(run)
        if problem is None and all(run.outcomes[c] == "PASSED" for c in run.collected):
            with _REFERENCE_LOCK:
                _REFERENCE_CHECKS[key] = run.collected
            return run.collected
        failed = [c for c in run.collected if run.outcomes.get(c) != "PASSED"]
        return (f"reference run: {problem or f'failed checks {failed[:4]}'} (solution.sh exit "
                f"{solution.exit_code}); log: {tail(run.log, 300)!r}")


def _run_problem(run: PytestRun) -> str | None:
    """Why a verifier run did not report every check normally (None: it did)."""
    if (problem := run.end_problem("the verifier")) is not None:
        return problem
    if not run.collected:
        return "the verifier reported no checks"
    errored = [c for c in run.collected if run.outcomes.get(c) == "ERROR"]
    if errored:
        return f"verifier checks errored in their setup or teardown: {errored[:4]}"
    missing = [c for c in run.collected if c not in run.outcomes]
    if missing:
        return f"no outcome for checks {missing[:4]}"
    return None


def _score(run: PytestRun, checks: tuple[str, ...], note: str) -> GradeReport:
    """SETA reward over `checks`: each one the run did not report PASSED is a failed check."""
    passed = sum(run.outcomes.get(c) == "PASSED" for c in checks)
    failed = [c for c in checks if run.outcomes.get(c) != "PASSED"]
    detail = f"{passed}/{len(checks)} checks passed" + (f"; failed: {failed[:4]}" if failed else "") + note
    return GradeReport(reward=seta_reward(passed, len(checks)), detail=detail, outcomes=dict(run.outcomes),
                       exit_code=run.exit_status, log_tail=tail(run.log))
