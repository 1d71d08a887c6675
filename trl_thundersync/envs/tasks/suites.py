"""The bundled task suites, read from package data.

Layout (one directory per task, the directory name is the task id):

    swe/<task_id>/task.json        problem_statement, fail_to_pass, pass_to_pass, [test_files, difficulty, slow]
    swe/<task_id>/repo/            the buggy repository copied into /workspace
    swe/<task_id>/solution/        overlay of fixed files (same relative paths as in repo/)

    terminal/<task_id>/task.json   instruction, [setup, difficulty]
    terminal/<task_id>/files/      optional starting files copied into /workspace before the setup commands
    terminal/<task_id>/test_outputs.py   the hidden pytest verifier (one test function = one check)
    terminal/<task_id>/solution.sh       the reference solution, run through the environment's `run_shell`
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import TaskFormatError
from .grading import check_relative
from .records import DEFAULT_TEST_COMMAND, SWETask, TerminalTask

_DIFFICULTIES = ("easy", "medium", "hard")


def tasks_root() -> Path:
    """Directory of the bundled suites; tasks are copied from it, so the package must be installed unzipped."""
    root = resources.files(__package__)
    if not isinstance(root, Path):
        raise TaskFormatError(f"bundled tasks must live on the file system, found {root!r}; install unzipped")
    return root


@functools.cache
def load_swe_suite() -> Mapping[str, SWETask]:
    """Every bundled SWE repair task, keyed by task id (read-only mapping, cached)."""
    suite_dir = tasks_root() / "swe"
    return MappingProxyType({d.name: _read_swe_task(d) for d in _task_dirs(suite_dir)})


@functools.cache
def load_terminal_suite() -> Mapping[str, TerminalTask]:
    """Every bundled terminal task, keyed by task id (read-only mapping, cached)."""
    suite_dir = tasks_root() / "terminal"
    return MappingProxyType({d.name: _read_terminal_task(d) for d in _task_dirs(suite_dir)})


def _task_dirs(suite_dir: Path) -> list[Path]:
    if not suite_dir.is_dir():
        raise TaskFormatError(f"task suite directory {suite_dir} is missing")
    return sorted(d for d in suite_dir.iterdir() if d.is_dir() and (d / "task.json").is_file())


def _read_json(task_dir: Path) -> dict[str, Any]:
    path = task_dir / "task.json"
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TaskFormatError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(spec, dict):
        raise TaskFormatError(f"{path}: expected a JSON object, got {type(spec).__name__}")
    return spec


def _field(spec: dict[str, Any], name: str, kind: type, where: str, default: Any = ...) -> Any:
    if name not in spec:
        if default is ...:
            raise TaskFormatError(f"{where}: missing field {name!r}")
        return default
    value = spec[name]
    if not isinstance(value, kind):
        raise TaskFormatError(f"{where}: field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _strings(spec: dict[str, Any], name: str, where: str, default: Any = ...) -> tuple[str, ...]:
    values = _field(spec, name, list, where, default)
    if not all(isinstance(v, str) and v for v in values):
        raise TaskFormatError(f"{where}: field {name!r} must be a list of non-empty strings")
    return tuple(values)


def _difficulty(spec: dict[str, Any], where: str) -> str:
    value = _field(spec, "difficulty", str, where, "medium")
    if value not in _DIFFICULTIES:
        raise TaskFormatError(f"{where}: difficulty {value!r} is not one of {_DIFFICULTIES}")
    return value


def _read_swe_task(task_dir: Path) -> SWETask:
    where = str(task_dir / "task.json")
    spec = _read_json(task_dir)
    repo_dir, solution_dir = task_dir / "repo", task_dir / "solution"
    for required in (repo_dir, solution_dir):
        if not required.is_dir():
            raise TaskFormatError(f"{where}: directory {required.name}/ is missing")
    default_tests = tuple(sorted(str(p.relative_to(repo_dir)) for p in (repo_dir / "tests").rglob("*.py")))
    test_files = _strings(spec, "test_files", where, list(default_tests))
    for rel in test_files:
        try:
            check_relative(rel, where)
        except ValueError as exc:
            raise TaskFormatError(str(exc)) from exc
        if not (repo_dir / rel).is_file():
            raise TaskFormatError(f"{where}: test file {rel!r} does not exist in repo/")
    return SWETask(
        task_id=task_dir.name,
        repo_dir=repo_dir,
        problem_statement=_field(spec, "problem_statement", str, where),
        fail_to_pass=_strings(spec, "fail_to_pass", where),
        pass_to_pass=_strings(spec, "pass_to_pass", where, []),
        test_files=test_files,
        test_command=_field(spec, "test_command", str, where, DEFAULT_TEST_COMMAND),
        solution_dir=solution_dir,
        difficulty=_difficulty(spec, where),
        slow=_field(spec, "slow", bool, where, False),
    )


def _read_terminal_task(task_dir: Path) -> TerminalTask:
    where = str(task_dir / "task.json")
    spec = _read_json(task_dir)
    verifier, solution = task_dir / "test_outputs.py", task_dir / "solution.sh"
    for required in (verifier, solution):
        if not required.is_file():
            raise TaskFormatError(f"{where}: {required.name} is missing")
    files_dir = task_dir / "files"
    return TerminalTask(
        task_id=task_dir.name,
        instruction=_field(spec, "instruction", str, where),
        verifier_file=verifier,
        solution_script=solution.read_text(encoding="utf-8"),
        files_dir=files_dir if files_dir.is_dir() else None,
        setup=_strings(spec, "setup", where, []),
        difficulty=_difficulty(spec, where),
    )
