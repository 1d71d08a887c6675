"""Validate the task suites (every registered `Suite`, every split): each task must be unsolved as shipped and solved
by its reference solution (`Suite.solution`).

    python -m trl_thundersync.envs.suites.validate                  # all suites, bubblewrap sandbox
    python -m trl_thundersync.envs.suites.validate --suite swe --task slugify_separators
    python -m trl_thundersync.envs.suites.validate --backend local  # UNSANDBOXED subprocess fallback (dev)

For each task: a fresh environment is reset and the untouched workspace is graded (SWE must get 0.0, terminal less
than the full 1.5); then a second fresh environment is reset, the reference solution is applied through the
environment's own `run_shell` tool, `submit` is called, and the attempt must get the full reward (SWE 1.0, terminal
1.5; lookup and thermostat 1.0). A SWE solution is an overlay directory: its files are written by one shell
command (base64 text decoded with `base64 -d`), exactly as an agent could write them. A terminal solution is
`solution.sh`, passed to `run_shell` as the command. Infrastructure errors (get_reward None) are reported
separately from wrong rewards.
Exit status: 0 when every task passes, 1 otherwise. `validate(my_suite)` validates a suite of your own.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from ..environments.shell_env import SandboxFactory
from ..runtimes.api import SandboxLimits
from .record import Suite
from .registry import get_suite, registered_suites, suite_names

ALL = "all"  # --suite value: every registered suite


@dataclass(frozen=True)
class TaskValidation:
    """The validation outcome of one task."""

    suite: str  # the suite's name
    task_id: str
    noop_reward: float | None  # reward of the untouched workspace (None: infrastructure error)
    solved_reward: float | None  # reward after the reference solution (None: infrastructure error)
    seconds: float  # wall clock of both episodes
    status: str  # "ok" | "fail" | "infra"
    message: str = ""  # why the task did not pass

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def validate_task(suite: str | Suite, task: Any, env_kwargs: dict) -> TaskValidation:
    """Grade the untouched task, then its reference solution (`Suite.solution`: each command through run_shell, in
    order, then submit), each in a fresh environment of the suite."""
    suite = get_suite(suite)
    start = time.perf_counter()
    with suite.environment(tasks={task.task_id: task}, **env_kwargs) as env:
        env.reset(task_id=task.task_id)
        noop, noop_infra = env.get_reward(), env.infra_error
    with suite.environment(tasks={task.task_id: task}, **env_kwargs) as env:
        env.reset(task_id=task.task_id)
        for command in suite.solution(task):
            env.run_shell(command)
            solution_result = env.last_result
            if solution_result is None or not solution_result.ok:
                break
        env.submit()
        solved, solved_infra = env.get_reward(), env.infra_error
        solved_detail = env.last_grade.detail if env.last_grade else ""
    seconds = time.perf_counter() - start
    full = suite.full_reward
    problems, status = [], "ok"
    if noop_infra or solved_infra:
        status = "infra"
        problems += [f"{name}: {err}" for name, err in (("no-op", noop_infra), ("solved", solved_infra)) if err]
    if noop is not None and noop >= full:
        problems.append(f"the untouched task already gets the full reward {noop}")
    if solution_result is None or not solution_result.ok:
        code = None if solution_result is None else solution_result.exit_code
        stderr = "" if solution_result is None else solution_result.stderr[-300:]
        problems.append(f"reference solution command failed (exit {code}): {stderr}")
    if solved is not None and solved != full:
        problems.append(f"reference solution got {solved}, expected {full} ({solved_detail})")
    if problems and status == "ok":
        status = "fail"
    return TaskValidation(suite.name, task.task_id, noop, solved, seconds, status, "; ".join(problems))


def validate(
    suite: str | Suite = ALL,
    task_ids: Iterable[str] = (),
    *,
    jobs: int = 4,
    backend: str = "bwrap",
    sandbox_factory: SandboxFactory | None = None,
    limits: SandboxLimits | None = None,
    progress: Callable[[int, int, TaskValidation], None] | None = None,
) -> list[TaskValidation]:
    """Validate the tasks of `suite` (a registered name, a `Suite` record, or "all": every registered suite), every
    split, on a thread pool; results in suite/task order."""
    selected = _select(suite, tuple(task_ids))
    env_kwargs = {"backend": backend, "sandbox_factory": sandbox_factory, "limits": limits}
    results: dict[tuple[str, str], TaskValidation] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="validate") as pool:
        futures = {pool.submit(validate_task, record, task, env_kwargs): (record.name, task.task_id)
                   for record, task in selected}
        for future in as_completed(futures):
            name, task_id = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # a task that cannot even be set up is reported, not fatal to the others
                result = TaskValidation(name, task_id, None, None, 0.0, "infra", f"{type(exc).__name__}: {exc}")
            results[name, task_id] = result
            if progress is not None:
                progress(len(results), len(futures), result)
    return [results[record.name, task.task_id] for record, task in selected]


def _select(suite: str | Suite, task_ids: tuple[str, ...]) -> list[tuple[Suite, Any]]:
    """(suite, task) of every task to validate: each split of each selected suite (held-out tasks are scored like
    the rest)."""
    if isinstance(suite, str) and suite != ALL and suite not in suite_names():
        raise ValueError(f"--suite must be one of {(*suite_names(), ALL)}, got {suite!r}")
    records = registered_suites() if suite == ALL else (get_suite(suite),)
    pool = [(record, task) for record in records for split in record.splits for task in record.load(split).values()]
    if task_ids:
        unknown = set(task_ids) - {t.task_id for _, t in pool}
        if unknown:
            raise ValueError(f"unknown task id(s) for suite {suite!r}: {sorted(unknown)}")
        pool = [(record, t) for record, t in pool if t.task_id in task_ids]
    return pool


def _fmt(reward: float | None) -> str:
    return "infra" if reward is None else f"{reward:.2f}"


def format_table(results: list[TaskValidation]) -> str:
    width = max([len(f"{r.suite}/{r.task_id}") for r in results] + [4])
    lines = [f"{'task':<{width}}  {'no-op':>6}  {'solved':>6}  {'sec':>6}  status"]
    for r in results:
        name = f"{r.suite}/{r.task_id}"
        rewards = f"{_fmt(r.noop_reward):>6}  {_fmt(r.solved_reward):>6}"
        lines.append(f"{name:<{width}}  {rewards}  {r.seconds:6.1f}  {r.status}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trl_thundersync.envs.suites.validate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default=ALL, choices=(*suite_names(), ALL))
    parser.add_argument("--task", action="append", default=[], help="validate only this task id (repeatable)")
    parser.add_argument("--jobs", type=int, default=4, help="tasks validated concurrently")
    parser.add_argument("--backend", default="bwrap",
                        help="make_sandbox backend; 'local' = UNSANDBOXED subprocess fallback for development")
    args = parser.parse_args(argv)
    factory = None
    if args.backend == "local":
        from ..runtimes.local import LocalSubprocessSandbox

        factory = LocalSubprocessSandbox
    try:
        selected = len(_select(args.suite, tuple(args.task)))
    except ValueError as exc:
        parser.error(str(exc))

    def progress(done: int, total: int, result: TaskValidation) -> None:
        print(f"[{done:>3}/{total}] {result.status:<5} {result.suite}/{result.task_id} ({result.seconds:.1f}s)",
              file=sys.stderr, flush=True)

    start = time.perf_counter()
    results = validate(args.suite, args.task, jobs=args.jobs, backend=args.backend, sandbox_factory=factory,
                       progress=progress)
    print(format_table(results))
    failed = [r for r in results if r.status == "fail"]
    infra = [r for r in results if r.status == "infra"]
    print(f"\n{selected} tasks in {time.perf_counter() - start:.1f}s: {selected - len(failed) - len(infra)} ok, "
          f"{len(failed)} failed, {len(infra)} infrastructure errors")
    for title, group in (("FAILED", failed), ("INFRASTRUCTURE ERRORS", infra)):
        if group:
            print(f"\n{title}:")
            for r in group:
                print(f"  {r.suite}/{r.task_id}: {r.message}")
    return 0 if not failed and not infra else 1


if __name__ == "__main__":
    sys.exit(main())
