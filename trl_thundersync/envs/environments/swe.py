"""`SWERepairEnv`: repair a small Python repository until its failing tests pass (TRL `environment_factory`).

    from trl_thundersync.envs.environments import SWERepairEnv
    from trl_thundersync.envs.tasks import swe_dataset
    trainer = GRPOTrainer(..., train_dataset=swe_dataset(), environment_factory=SWERepairEnv)

Grading (in a fresh host copy of the workspace, made within `GradingLimits` and inside `grade_timeout_s`): every
test file and pytest harness file is restored from the grading source, then the FAIL_TO_PASS and PASS_TO_PASS node
ids run with the task's pytest arguments through the grading runner, which reports each outcome in records
authenticated with a per-run key the code under test never sees (`tasks.pytest_channel`; pytest's console output
is never parsed).
Reward 1.0 iff every FAIL_TO_PASS test passes and no PASS_TO_PASS test fails, else 0.0.

When the run did not report every requested test normally — pytest could not run them (exit 2-5: collection,
internal or usage error), the run was cut short (the code under test exited or killed pytest, or it timed out), or
an outcome is missing — the reference solution is run the same way: if it passes, the attempt caused the failure
(0.0); if it fails too, the grading harness is broken (None + `infra_error`). A workspace over the grading limits
is a failed attempt (0.0); a sandbox or host failure is infrastructure (None).
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..runtimes.api import Sandbox
from ..tasks.grading import PYTEST_REPORT_FLAGS, GradeReport, UngradableWorkspace, remove_path, swe_reward, tail
from ..tasks.pytest_channel import PytestRun, pytest_invocation
from ..tasks.records import SWETask
from ..tasks.suites import load_swe_suite
from ..tasks.swe_files import build_grading_source, materialize_reference, materialize_start, restore_harness
from .pytest_graded import PytestGradedEnv

# Task ids whose reference solution was seen to pass, shared by all instances (the outcome does not depend on the
# agent). Only successes are cached, so a transient failure is retried next time.
_REFERENCE_OK: set[tuple[str, str]] = set()
_REFERENCE_LOCK = threading.Lock()


class SWERepairEnv(PytestGradedEnv):
    """SWE-style repair environment over a mapping of `SWETask`s (default: the bundled suite).

    Keyword arguments (all optional): `tasks` (mapping or iterable of SWETask), `limits` (SandboxLimits for agent
    commands), `backend` (make_sandbox backend, default "bwrap"), `sandbox_factory` ((workspace, limits) ->
    Sandbox, overrides backend), `grade_timeout_s` (wall clock of one grading run, copying included),
    `grading_limits` (GradingLimits of the workspace copy made for grading).
    """

    kind = "swe"

    def __init__(self, tasks: Mapping[str, SWETask] | Iterable[SWETask] | None = None, **kwargs) -> None:
        self._scratch: Path | None = None  # private host directory for grading sources of patched tasks
        super().__init__(tasks, **kwargs)

    def _default_suite(self) -> Mapping[str, SWETask]:
        return load_swe_suite()

    def _answer_paths(self) -> tuple[Path, ...]:
        return () if self.task.solution_dir is None else (self.task.solution_dir,)

    def _prepare_workspace(self, workspace: Path) -> None:
        pytest_invocation(self.task.test_command, f"task {self.task.task_id}")  # refuse an ungradable task now
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
        deadline = self._deadline()
        try:
            run = self._run_tests(lambda copy: self._populate_attempt(copy, source, deadline), deadline)
        except UngradableWorkspace as exc:
            return GradeReport(reward=0.0, detail=f"the workspace cannot be graded: {exc}")
        problem = _run_problem(run, task.fail_to_pass + task.pass_to_pass)
        if problem is None:
            reward = swe_reward(run.outcomes, task.fail_to_pass, task.pass_to_pass)
            detail = "all required tests pass" if reward == 1.0 else _failure_detail(run.outcomes, task)
            return _report(reward, detail, run)
        reference_problem = self._reference_problem(source)
        if reference_problem is None:
            return _report(0.0, f"{problem} after the attempt's changes, while the reference solution passes", run)
        return GradeReport(reward=None, detail="infrastructure error", exit_code=run.exit_status,
                           log_tail=tail(run.log), infra_error=f"grading harness broken: {problem} for the attempt, "
                           f"and the reference solution fails too ({reference_problem})")

    def _populate_attempt(self, copy: Path, source: Path, deadline: float) -> None:
        """The agent's files, with every test and harness file put back as the grading source has them."""
        self._copy_attempt(copy, deadline)
        restore_harness(copy, source, self.task.test_files)

    def _run_tests(self, populate, deadline: float) -> PytestRun:
        """Populate a fresh copy and run the task's tests over it, in a fresh sandbox, through the grading runner."""
        python, args = pytest_invocation(self.task.test_command, f"task {self.task.task_id}")
        ids = self.task.fail_to_pass + self.task.pass_to_pass
        return self._run_in_copy(populate, (*args, *PYTEST_REPORT_FLAGS, *ids), deadline=deadline,
                                 cwd_on_path=True, python=python)

    def _reference_problem(self, source: Path) -> str | None:
        """None when the reference solution passes the grading run, else what went wrong."""
        key = (self.task.task_id, str(self.task.repo_dir))
        with _REFERENCE_LOCK:
            if key in _REFERENCE_OK:
                return None
        if not self.task.has_reference:
            return "the task has no reference solution to check the harness with"
        try:
            run = self._run_tests(lambda copy: materialize_reference(self.task, copy, source), self._deadline())
        except UngradableWorkspace as exc:  # the trusted reference tree over the grading bounds: the task is broken
            return f"reference run: {exc}"
        problem = _run_problem(run, self.task.fail_to_pass + self.task.pass_to_pass)
        if problem is None and swe_reward(run.outcomes, self.task.fail_to_pass, self.task.pass_to_pass) == 1.0:
            with _REFERENCE_LOCK:
                _REFERENCE_OK.add(key)
            return None
        return f"reference run: {problem or _failure_detail(run.outcomes, self.task)}; log: {tail(run.log, 300)!r}"

    def _drop_caches(self) -> None:
        scratch, self._scratch = self._scratch, None
        if scratch is not None:
            remove_path(scratch)


def _run_problem(run: PytestRun, node_ids: tuple[str, ...]) -> str | None:
    """Why a grading run did not report every requested test normally (None: it did)."""
    if (problem := run.end_problem("the tests")) is not None:
        return problem
    missing = [n for n in node_ids if n not in run.outcomes]
    if missing:
        return f"pytest reported no outcome for {missing[:5]}"
    return None


def _report(reward: float, detail: str, run: PytestRun) -> GradeReport:
    return GradeReport(reward=reward, detail=detail, outcomes=dict(run.outcomes), exit_code=run.exit_status,
                       log_tail=tail(run.log))


def _failure_detail(outcomes: dict[str, str], task: SWETask) -> str:
    unfixed = [n for n in task.fail_to_pass if outcomes.get(n) not in ("PASSED", "XFAIL")]
    broken = [n for n in task.pass_to_pass if outcomes.get(n) in ("FAILED", "ERROR", "XPASS")]
    return f"still failing: {unfixed[:3]}; newly broken: {broken[:3]}"
