"""Load SWE-smith / SWE-bench style rows as `SWETask`s that run against local git checkouts (no network).

Row fields: `instance_id`, `repo` ("owner/name"), `base_commit`, `patch` (the gold fix), `test_patch` (the tests
that decide the task), `problem_statement`, `FAIL_TO_PASS`, `PASS_TO_PASS` (lists, or JSON-encoded lists as in the
published datasets); `image_name` and any other fields are accepted and ignored.

Expected layout: `repo_root/<owner>__<name>/` is a git clone of `repo` that contains `base_commit` (one clone
serves every row of that repository). The workspace receives `git archive <base_commit>` (without .git);
`test_patch` is applied only when grading, with `git apply` on the host in a private directory; `patch` is the
reference solution. FAIL_TO_PASS / PASS_TO_PASS must be pytest node ids (as in SWE-smith and most SWE-bench repos;
Django-style test labels are not supported).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import TaskFormatError
from .grading import check_relative
from .records import DEFAULT_TEST_COMMAND, SWETask
from .swe_files import patch_paths

REQUIRED_FIELDS = (
    "instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS",
)


def load_swe_rows(
    path_or_rows: str | Path | Iterable[Mapping[str, Any]],
    repo_root: str | Path,
    *,
    test_command: str = DEFAULT_TEST_COMMAND,
) -> dict[str, SWETask]:
    """SWETasks keyed by instance id, from a .json (list of rows) / .jsonl file or from rows in memory."""
    rows = _read_rows(Path(path_or_rows)) if isinstance(path_or_rows, (str, Path)) else list(path_or_rows)
    repo_root = Path(repo_root)
    tasks: dict[str, SWETask] = {}
    for index, row in enumerate(rows):
        task = _row_to_task(row, index, repo_root, test_command)
        if task.task_id in tasks:
            raise TaskFormatError(f"row {index}: duplicate instance_id {task.task_id!r}")
        tasks[task.task_id] = task
    return tasks


def checkout_dir(repo_root: Path, repo: str) -> Path:
    """Where the clone of `repo` ("owner/name") is expected: `repo_root/owner__name`."""
    return Path(repo_root) / repo.replace("/", "__")


def _read_rows(path: Path) -> list[Any]:
    if not path.is_file():
        raise TaskFormatError(f"SWE rows file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskFormatError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(rows, list):
        raise TaskFormatError(f"{path}: expected a JSON list of rows, got {type(rows).__name__}")
    return rows


def _row_to_task(row: Any, index: int, repo_root: Path, test_command: str) -> SWETask:
    if not isinstance(row, Mapping):
        raise TaskFormatError(f"row {index}: expected an object, got {type(row).__name__}")
    where = f"row {index} ({row.get('instance_id', '?')})"
    missing = [name for name in REQUIRED_FIELDS if name not in row]
    if missing:
        raise TaskFormatError(f"{where}: missing field(s) {missing}")
    for name in ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement"):
        if not isinstance(row[name], str) or not row[name].strip():
            raise TaskFormatError(f"{where}: field {name!r} must be a non-empty string")
    fail_to_pass = _test_ids(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
    if not fail_to_pass:
        raise TaskFormatError(f"{where}: FAIL_TO_PASS is empty; nothing would decide the task")
    checkout = checkout_dir(repo_root, row["repo"])
    if not (checkout / ".git").exists():
        raise TaskFormatError(
            f"{where}: expected a git checkout of {row['repo']!r} at {checkout} (repo_root/<owner>__<name>); "
            "the test patch is applied with `git apply` and the start files come from `git archive <base_commit>`"
        )
    test_files = patch_paths(row["test_patch"])
    if not test_files:
        raise TaskFormatError(f"{where}: field 'test_patch' is not a git diff (no 'diff --git' header)")
    try:
        test_files = tuple(check_relative(p, where) for p in test_files)
    except ValueError as exc:
        raise TaskFormatError(str(exc)) from exc
    return SWETask(
        task_id=row["instance_id"], repo_dir=checkout, problem_statement=row["problem_statement"],
        fail_to_pass=fail_to_pass, pass_to_pass=_test_ids(row["PASS_TO_PASS"], "PASS_TO_PASS", where),
        test_files=test_files, test_command=test_command, solution_patch=row["patch"],
        base_commit=row["base_commit"], test_patch=row["test_patch"],
    )


def _test_ids(value: Any, name: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):  # the published datasets store these lists JSON-encoded
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise TaskFormatError(f"{where}: field {name!r} is a string but not a JSON list ({exc})") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TaskFormatError(f"{where}: field {name!r} must be a list of test ids (or a JSON-encoded list)")
    return tuple(value)
