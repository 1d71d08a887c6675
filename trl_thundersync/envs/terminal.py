"""`TerminalTaskEnv`: SETA / Terminal-Bench style shell tasks graded by a hidden pytest verifier.

    from trl_thundersync.envs.terminal import TerminalTaskEnv
    from trl_thundersync.envs.tasks import terminal_dataset
    trainer = GRPOTrainer(..., train_dataset=terminal_dataset(), environment_factory=TerminalTaskEnv)

Verifier design: each task ships `test_outputs.py`, a pytest file whose test functions are the named checks. The
agent never sees it: at grading, a fresh host copy of the workspace gets a `.verifier/` directory holding the file
and an empty pytest.ini, and pytest runs with `python3 -P` (the workspace is not on sys.path), `--noconftest` and
`-c .verifier/pytest.ini`, so nothing the agent wrote can configure or hijack the run. Tests find the task files
in the current directory (the workspace).

Reward (SETA): p = passed checks / all checks, reward = p + 0.5 * (p == 1). A check that raises (file missing,
wrong content, the agent's script timing out inside `subprocess.run(..., timeout=...)`) is a failed check. When
pytest does not run the checks normally (exit code 2-5, an ERROR in a check's setup, a timeout of the whole
verifier, no checks found) the verifier itself is broken: get_reward returns None and sets `infra_error`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from .sandbox_api import Sandbox
from .tasks.errors import TaskSetupError
from .tasks.grading import (
    PYTEST_REPORT_FLAGS, PYTEST_TESTS_RAN, GradeReport, copy_tree, parse_summary, read_log, remove_path, seta_reward,
    tail,
)
from .tasks.records import TerminalTask
from .tasks.shell_env import ShellTaskEnv
from .tasks.suites import load_terminal_suite

VERIFIER_DIR = ".verifier"  # created in the grading copy only
_VERIFY_COMMAND = (
    f"python3 -P -m pytest -q -p no:cacheprovider --noconftest -c {VERIFIER_DIR}/pytest.ini "
    f"--rootdir {VERIFIER_DIR} {PYTEST_REPORT_FLAGS} {VERIFIER_DIR}/test_outputs.py > {VERIFIER_DIR}/log 2>&1"
)


class TerminalTaskEnv(ShellTaskEnv):
    """Terminal task environment over a mapping of `TerminalTask`s (default: the bundled suite).

    Keyword arguments (all optional): `tasks` (mapping or iterable of TerminalTask), `limits` (SandboxLimits for
    agent and setup commands), `backend` (make_sandbox backend, default "bwrap"), `sandbox_factory` ((workspace,
    limits) -> Sandbox, overrides backend), `grade_timeout_s` (wall clock of the verifier run).
    """

    kind = "terminal"

    def __init__(self, tasks: Mapping[str, TerminalTask] | Iterable[TerminalTask] | None = None, **kwargs) -> None:
        super().__init__(tasks, **kwargs)

    def _default_suite(self) -> Mapping[str, TerminalTask]:
        return load_terminal_suite()

    def _prepare_workspace(self, workspace: Path) -> None:
        if self.task.files_dir is not None:
            copy_tree(self.task.files_dir, workspace)

    def _setup_in_sandbox(self, sandbox: Sandbox) -> None:
        for command in self.task.setup:
            result = sandbox.run(command)
            if not result.ok:
                raise TaskSetupError(
                    f"task {self.task.task_id}: setup command {command!r} failed (exit {result.exit_code}, "
                    f"timed out: {result.timed_out}): {result.stderr[-800:]}"
                )

    def _grade(self) -> GradeReport:
        copy = Path(tempfile.mkdtemp(prefix=f"ts-terminal-grade-{self.task.task_id}-"))
        sandbox = None
        try:
            copy_tree(self.workspace, copy)
            verifier_dir = copy / VERIFIER_DIR
            remove_path(verifier_dir)  # anything the agent put there
            verifier_dir.mkdir()
            shutil.copy2(self.task.verifier_file, verifier_dir / "test_outputs.py")
            (verifier_dir / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
            sandbox = self._new_sandbox(copy)
            result = sandbox.run(_VERIFY_COMMAND, timeout_s=self.grade_timeout_s,
                                 env={"PYTHONDONTWRITEBYTECODE": "1"})
            log = read_log(verifier_dir / "log")
        finally:
            try:
                if sandbox is not None:
                    sandbox.close()
            finally:
                remove_path(copy)
        return _score(result.exit_code if not result.timed_out else None, log)


def _score(exit_code: int | None, log: str) -> GradeReport:
    """Turn one verifier run into a report: SETA reward, or an infrastructure error."""
    outcomes = parse_summary(log)
    if exit_code is None:
        problem = "the verifier timed out or was killed"
    elif exit_code not in PYTEST_TESTS_RAN:
        problem = f"the verifier did not run (pytest exit {exit_code}: collection, internal or usage error)"
    elif any(status == "ERROR" for status in outcomes.values()):
        problem = "a verifier check errored in its setup: " + ", ".join(
            n for n, status in outcomes.items() if status == "ERROR")
    elif not outcomes:
        problem = "the verifier reported no checks"
    else:
        problem = None
    if problem is not None:
        return GradeReport(reward=None, detail="infrastructure error", outcomes=outcomes, exit_code=exit_code,
                           log_tail=tail(log), infra_error=problem)
    passed = sum(status == "PASSED" for status in outcomes.values())
    reward = seta_reward(passed, len(outcomes))
    failed = [n for n, status in outcomes.items() if status != "PASSED"]
    detail = f"{passed}/{len(outcomes)} checks passed" + (f"; failed: {failed[:4]}" if failed else "")
    return GradeReport(reward=reward, detail=detail, outcomes=outcomes, exit_code=exit_code, log_tail=tail(log))
