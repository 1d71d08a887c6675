"""Validate the bundled task suites: every task must be unsolved as shipped and solved by its reference solution.

    python -m trl_thundersync.envs.environments.validate                  # all suites, bubblewrap sandbox
    python -m trl_thundersync.envs.environments.validate --suite swe --task slugify_separators
    python -m trl_thundersync.envs.environments.validate --backend local  # UNSANDBOXED subprocess fallback (dev)

For each task: a fresh environment is reset and the untouched workspace is graded (SWE must get 0.0, terminal less
than the full 1.5); then a second fresh environment is reset, the reference solution is applied through the
environment's own `run_shell` tool, `submit` is called, and the attempt must get the full reward (SWE 1.0, terminal
1.5; lookup and thermostat 1.0). A SWE solution is an overlay directory: its files are written by one shell
command (base64 text decoded with `base64 -d`), exactly as an agent could write them. A terminal solution is
`solution.sh`, passed to `run_shell` as the command. Infrastructure errors (get_reward None) are reported
separately from wrong rewards.
Exit status: 0 when every task passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from ..runtimes.api import SandboxLimits
from ..tasks.lookup import LookupTask, load_lookup_suite
from ..tasks.records import SWETask, TerminalTask
from ..tasks.suites import load_swe_suite, load_terminal_suite
from ..tasks.thermostat import ThermostatTask, load_thermostat_suite
from .lookup import LookupTaskEnv
from .shell_env import SandboxFactory
from .swe import SWERepairEnv
from .terminal import TerminalTaskEnv
from .thermostat import ThermostatTaskEnv

FULL_REWARD = {"swe": 1.0, "terminal": 1.5, "lookup": 1.0, "thermostat": 1.0}
_ENVS = {"swe": SWERepairEnv, "terminal": TerminalTaskEnv, "lookup": LookupTaskEnv, "thermostat": ThermostatTaskEnv}
SUITE_CHOICES = ("swe", "terminal", "lookup", "thermostat", "all")
_MULTI_COMMAND = ("lookup", "thermostat")  # suites whose reference solution is several run_shell commands
_AnyTask = SWETask | TerminalTask | LookupTask | ThermostatTask


@dataclass(frozen=True)
class TaskValidation:
    """The validation outcome of one task."""

    suite: str  # "swe" | "terminal"
    task_id: str
    noop_reward: float | None  # reward of the untouched workspace (None: infrastructure error)
    solved_reward: float | None  # reward after the reference solution (None: infrastructure error)
    seconds: float  # wall clock of both episodes
    status: str  # "ok" | "fail" | "infra"
    message: str = ""  # why the task did not pass

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def overlay_command(solution_dir: Path) -> str:
    """One shell command that writes every file of an overlay directory into the current directory."""
    steps = []
    for path in sorted(p for p in solution_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(solution_dir).as_posix()
        encoded = base64.b64encode(path.read_bytes()).decode()
        parent = Path(rel).parent.as_posix()
        mkdir = f"mkdir -p {shlex.quote(parent)} && " if parent != "." else ""
        steps.append(f"{mkdir}printf %s {encoded} | base64 -d > {shlex.quote(rel)}")
    return " && ".join(steps)


def validate_task(suite: str, task: _AnyTask, env_kwargs: dict) -> TaskValidation:
    """Grade the untouched task, then its reference solution, each in a fresh environment (a lookup or thermostat
    solution is several commands: each one through run_shell, in order)."""
    env_class = _ENVS[suite]
    start = time.perf_counter()
    with env_class(tasks={task.task_id: task}, **env_kwargs) as env:
        env.reset(task_id=task.task_id)
        noop, noop_infra = env.get_reward(), env.infra_error
    with env_class(tasks={task.task_id: task}, **env_kwargs) as env:
        env.reset(task_id=task.task_id)
        if suite in _MULTI_COMMAND:
            commands = task.solution_commands
        else:
            commands = (overlay_command(task.solution_dir) if suite == "swe" else task.solution_script,)
        for command in commands:
            env.run_shell(command)
            solution_result = env.last_result
            if solution_result is None or not solution_result.ok:
                break
        env.submit()
        solved, solved_infra = env.get_reward(), env.infra_error
        solved_detail = env.last_grade.detail if env.last_grade else ""
    seconds = time.perf_counter() - start
    full = FULL_REWARD[suite]
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
    return TaskValidation(suite, task.task_id, noop, solved, seconds, status, "; ".join(problems))


def validate(
    suite: str = "all",
    task_ids: Iterable[str] = (),
    *,
    jobs: int = 4,
    backend: str = "bwrap",
    sandbox_factory: SandboxFactory | None = None,
    limits: SandboxLimits | None = None,
    progress: Callable[[int, int, TaskValidation], None] | None = None,
) -> list[TaskValidation]:
    """Validate the selected bundled tasks on a thread pool; results in suite/task order."""
    selected = _select(suite, tuple(task_ids))
    env_kwargs = {"backend": backend, "sandbox_factory": sandbox_factory, "limits": limits}
    results: dict[tuple[str, str], TaskValidation] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="validate") as pool:
        futures = {pool.submit(validate_task, kind, task, env_kwargs): (kind, task.task_id) for kind, task in selected}
        for future in as_completed(futures):
            kind, task_id = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # a task that cannot even be set up is reported, not fatal to the others
                result = TaskValidation(kind, task_id, None, None, 0.0, "infra", f"{type(exc).__name__}: {exc}")
            results[kind, task_id] = result
            if progress is not None:
                progress(len(results), len(futures), result)
    return [results[kind, task.task_id] for kind, task in selected]


def _select(suite: str, task_ids: tuple[str, ...]) -> list[tuple[str, _AnyTask]]:
    if suite not in SUITE_CHOICES:
        raise ValueError(f"--suite must be one of {SUITE_CHOICES}, got {suite!r}")
    pool: list[tuple[str, _AnyTask]] = []
    if suite in ("swe", "all"):
        pool += [("swe", t) for t in load_swe_suite().values()]
    if suite in ("terminal", "all"):
        pool += [("terminal", t) for t in load_terminal_suite().values()]
    if suite in ("lookup", "all"):  # both splits: held-out tasks are scored like the rest
        pool += [("lookup", t) for split in ("train", "heldout") for t in load_lookup_suite(split).values()]
    if suite in ("thermostat", "all"):
        pool += [("thermostat", t) for split in ("train", "heldout") for t in load_thermostat_suite(split).values()]
    if task_ids:
        unknown = set(task_ids) - {t.task_id for _, t in pool}
        if unknown:
            raise ValueError(f"unknown task id(s) for suite {suite!r}: {sorted(unknown)}")
        pool = [(kind, t) for kind, t in pool if t.task_id in task_ids]
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
    parser = argparse.ArgumentParser(prog="python -m trl_thundersync.envs.environments.validate",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="all", choices=SUITE_CHOICES)
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
