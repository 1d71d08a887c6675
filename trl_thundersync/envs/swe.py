"""`SWERepairEnv`: repair a small Python repository until its failing tests pass (TRL `environment_factory`).

    from trl_thundersync.envs.swe import SWERepairEnv
    from trl_thundersync.envs.tasks import swe_dataset
    trainer = GRPOTrainer(..., train_dataset=swe_dataset(), environment_factory=SWERepairEnv)

Grading (in a fresh host copy of the workspace): every test file and pytest harness file is restored from the
grading source, then the FAIL_TO_PASS and PASS_TO_PASS node ids run with the task's pytest command. Reward 1.0 iff
every FAIL_TO_PASS test passes and no PASS_TO_PASS test fails, else 0.0. When pytest does not get to run the tests
(exit code 2-5: collection, internal or usage error) the reference solution is run the same way: if it passes,
the attempt broke the tests (0.0); if it fails too, the grading harness is broken (None + `infra_error`). A grading
run that times out is a failed attempt (0.0, the attempt's code hung); a sandbox or host failure is infrastructure.
"""

from __future__ import annotations

import shlex
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from .sandbox_api import Sandbox
from .tasks.grading import (
    PYTEST_REPORT_FLAGS, PYTEST_TESTS_RAN, GradeReport, copy_tree, parse_summary, read_log, remove_path, swe_reward,
    tail,
)
from .tasks.records import SWETask
from .tasks.shell_env import ShellTaskEnv
from .tasks.suites import load_swe_suite
from .tasks.swe_files import build_grading_source, materialize_reference, materialize_start, restore_harness

_LOG_NAME = ".thundersync-grade.log"  # grading log, written inside the grading copy

# Task ids whose reference solution was seen to pass, shared by all instances (the outcome does not depend on the
# agent). Only successes are cached, so a transient failure is retried next time.
_REFERENCE_OK: set[tuple[str, str]] = set()
_REFERENCE_LOCK = threading.Lock()


class SWERepairEnv(ShellTaskEnv):
    """SWE-style repair environment over a mapping of `SWETask`s (default: the bundled suite).

    Keyword arguments (all optional): `tasks` (mapping or iterable of SWETask), `limits` (SandboxLimits for agent
    commands), `backend` (make_sandbox backend, default "bwrap"), `sandbox_factory` ((workspace, limits) ->
    Sandbox, overrides backend), `grade_timeout_s` (wall clock of one grading run).
    """

    kind = "swe"

    def __init__(self, tasks: Mapping[str, SWETask] | Iterable[SWETask] | None = None, **kwargs) -> None:
        self._scratch: Path | None = None  # private host directory for grading sources of patched tasks
        super().__init__(tasks, **kwargs)

    def _default_suite(self) -> Mapping[str, SWETask]:
        return load_swe_suite()

    def _prepare_workspace(self, workspace: Path) -> None:
        materialize_start(self.task, workspace)

    def _setup_in_sandbox(self, sandbox: Sandbox) -> None:
        return None  # the repository is ready as copied

    def _grading_source(self) -> Path:
        if self.task.test_patch is None:
            return self.task.repo_dir
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="ts-swe-grading-source-"))
        return build_grading_source(self.task, self._scratch / self.task.task_id)

    def _grade(self) -> GradeReport:
        task = self.task
        source = self._grading_source()
        exit_code, log = self._run_tests(lambda copy: self._populate_attempt(copy, source))
        node_ids = task.fail_to_pass + task.pass_to_pass
        if exit_code in PYTEST_TESTS_RAN:
            outcomes = parse_summary(log, node_ids)
            missing = [n for n in node_ids if n not in outcomes]
            if missing:
                return _infra(f"pytest ran but reported no outcome for {missing[:5]}", exit_code, log)
            reward = swe_reward(outcomes, task.fail_to_pass, task.pass_to_pass)
            detail = "all required tests pass" if reward == 1.0 else _failure_detail(outcomes, task)
            return GradeReport(reward=reward, detail=detail, outcomes=outcomes, exit_code=exit_code,
                               log_tail=tail(log))
        if exit_code is None:  # the attempt's code hung or was killed: a failed attempt
            return GradeReport(reward=0.0, detail="the tests timed out or were killed", log_tail=tail(log))
        reference_problem = self._reference_problem(source)
        if reference_problem is None:
            return GradeReport(reward=0.0, detail=f"pytest could not run the tests (exit {exit_code}) after the "
                               "attempt's changes, while the reference solution passes", exit_code=exit_code,
                               log_tail=tail(log))
        return _infra(f"grading harness broken: pytest exit {exit_code} for the attempt, and the reference solution "
                      f"fails too ({reference_problem})", exit_code, log)

    def _populate_attempt(self, copy: Path, source: Path) -> None:
        """The agent's files, with every test and harness file put back as the grading source has them."""
        copy_tree(self.workspace, copy)
        restore_harness(copy, source, self.task.test_files)

    def _run_tests(self, populate) -> tuple[int | None, str]:
        """Populate a fresh copy, run the task's tests in a fresh sandbox over it; (exit code, log)."""
        copy = Path(tempfile.mkdtemp(prefix=f"ts-swe-grade-{self.task.task_id}-"))
        sandbox = None
        try:
            populate(copy)
            remove_path(copy / _LOG_NAME)  # whatever the attempt left under that name
            sandbox = self._new_sandbox(copy)
            ids = " ".join(shlex.quote(n) for n in self.task.fail_to_pass + self.task.pass_to_pass)
            command = f"{self.task.test_command} {PYTEST_REPORT_FLAGS} {ids} > {_LOG_NAME} 2>&1"
            result = sandbox.run(command, timeout_s=self.grade_timeout_s, env={"PYTHONDONTWRITEBYTECODE": "1"})
            exit_code = None if result.timed_out else result.exit_code
            return exit_code, read_log(copy / _LOG_NAME)
        finally:
            try:
                if sandbox is not None:
                    sandbox.close()
            finally:
                remove_path(copy)

    def _reference_problem(self, source: Path) -> str | None:
        """None when the reference solution passes the grading run, else what went wrong."""
        key = (self.task.task_id, str(self.task.repo_dir))
        with _REFERENCE_LOCK:
            if key in _REFERENCE_OK:
                return None
        if not self.task.has_reference:
            return "the task has no reference solution to check the harness with"
        exit_code, log = self._run_tests(lambda copy: materialize_reference(self.task, copy, source))
        node_ids = self.task.fail_to_pass + self.task.pass_to_pass
        if exit_code in PYTEST_TESTS_RAN:
            outcomes = parse_summary(log, node_ids)
            if swe_reward(outcomes, self.task.fail_to_pass, self.task.pass_to_pass) == 1.0 and all(
                n in outcomes for n in node_ids
            ):
                with _REFERENCE_LOCK:
                    _REFERENCE_OK.add(key)
                return None
        return f"reference run exit {exit_code}: {tail(log, 300)!r}"

    def _drop_caches(self) -> None:
        scratch, self._scratch = self._scratch, None
        if scratch is not None:
            remove_path(scratch)


def _infra(message: str, exit_code: int | None, log: str) -> GradeReport:
    return GradeReport(reward=None, detail="infrastructure error", exit_code=exit_code, log_tail=tail(log),
                       infra_error=message)


def _failure_detail(outcomes: dict[str, str], task: SWETask) -> str:
    unfixed = [n for n in task.fail_to_pass if outcomes.get(n) not in ("PASSED", "XFAIL")]
    broken = [n for n in task.pass_to_pass if outcomes.get(n) in ("FAILED", "ERROR", "XPASS")]
    return f"still failing: {unfixed[:3]}; newly broken: {broken[:3]}"
