"""Where a SWE task's files come from: the starting tree, the grading source, the reference (solved) tree.

* Bundled tasks: `repo_dir` is a plain tree whose test files are also the grading tests; the fix is an overlay
  directory (`solution_dir`).
* SWE-bench style rows (`load_swe_rows`): `repo_dir` is a git checkout; the starting tree is `git archive` of
  `base_commit` (no .git in the workspace); the grading source is that tree with `test_patch` applied (on the host,
  in a private directory the agent never sees); the fix is the `patch` diff.

"Harness files" are restored from the grading source before every grade, besides the task's test files: pytest
configuration and anything that could hijack the run (conftest.py, pytest.ini, pytest.py shadowing pytest, ...).
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

from ..errors import TaskSetupError
from .grading import copy_task_files, remove_path, restore_file
from .records import SWETask

HARNESS_NAMES = frozenset({
    "conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
    "pytest.py", "py.py", "_pytest", "pluggy", "sitecustomize.py", "usercustomize.py",
})


def materialize_start(task: SWETask, dst: Path) -> None:
    """Write the task's starting repository into `dst` (an existing, empty directory)."""
    if task.base_commit is None:
        copy_task_files(task.repo_dir, dst)
        return
    archive = _git(["archive", "--format=tar", task.base_commit], cwd=task.repo_dir, what=f"export {task.task_id}")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dst, filter="data")


def build_grading_source(task: SWETask, scratch: Path) -> Path:
    """The tree test files are restored from: `repo_dir` itself, or (with a test patch) a patched export."""
    if task.test_patch is None:
        return task.repo_dir
    source = scratch / "grading-source"
    if not source.is_dir():
        staging = scratch / "grading-source.partial"
        remove_path(staging)
        staging.mkdir(parents=True)
        materialize_start(task, staging)
        apply_patch(staging, task.test_patch, what=f"test_patch of {task.task_id}")
        staging.rename(source)
    return source


def materialize_reference(task: SWETask, dst: Path, grading_source: Path) -> None:
    """Write the solved repository (start + grading tests + reference fix) into `dst`."""
    if not task.has_reference:
        raise TaskSetupError(f"task {task.task_id} has no reference solution (solution_dir or solution_patch)")
    materialize_start(task, dst)
    restore_harness(dst, grading_source, task.test_files)
    if task.solution_dir is not None:
        copy_task_files(task.solution_dir, dst)
    if task.solution_patch is not None:
        apply_patch(dst, task.solution_patch, what=f"solution patch of {task.task_id}")


def restore_harness(root: Path, source: Path, test_files: tuple[str, ...]) -> None:
    """Restore test files and harness files in `root` from `source` (deleting ones the source does not have)."""
    harness = _harness_paths(root) | _harness_paths(source)
    for rel in sorted(set(test_files) | harness):
        restore_file(root, source, rel)


def _harness_paths(root: Path) -> set[str]:
    found = set()
    for directory, dirnames, filenames in os.walk(root):  # never follows directory links
        for name in HARNESS_NAMES.intersection(dirnames + filenames):
            found.add(os.path.relpath(os.path.join(directory, name), root))
        dirnames[:] = [d for d in dirnames if d not in HARNESS_NAMES and d != ".git"]
    return found


def apply_patch(directory: Path, patch: str, *, what: str) -> None:
    """Apply a unified diff with `git apply` in a trusted directory (never in an agent's workspace)."""
    _git(["apply", "--whitespace=nowarn", "-"], cwd=directory, what=f"apply {what}", stdin=patch.encode())


def patch_paths(patch: str) -> tuple[str, ...]:
    """Repo-relative paths a unified git diff touches (new side; the old side for deletions)."""
    paths: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            old, _, new = line[len("diff --git "):].partition(" b/")
            path = new if new else old.removeprefix("a/")
            if path not in paths:
                paths.append(path)
    return tuple(paths)


def _git(args: list[str], *, cwd: Path, what: str, stdin: bytes | None = None) -> bytes:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CEILING_DIRECTORIES": str(Path(cwd).parent), "LANG": "C",
    }
    try:
        done = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, env=env, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TaskSetupError(f"could not {what}: {exc}") from exc
    if done.returncode != 0:
        raise TaskSetupError(f"could not {what}: git {args[0]} exited {done.returncode}: {done.stderr.decode()[-800:]}")
    return done.stdout
