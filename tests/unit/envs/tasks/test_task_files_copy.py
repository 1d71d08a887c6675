"""Task files reach workspaces without bytecode (issue 24 item 1): pip compiles an installed wheel's .py files,
bundled task data included, so an installed copy of a task holds `__pycache__` folders the checkout does not; the
workspace an agent gets (and the reference tree) must be the same from either.

Runs without bubblewrap (the environment test uses the unsandboxed local backend: only the workspace's files matter).
Run: python -m pytest tests/unit/envs/tasks/test_task_files_copy.py -q
"""

from __future__ import annotations

import compileall
import dataclasses
import os
import shutil
from pathlib import Path

from trl_thundersync.envs.environments.terminal import TerminalTaskEnv
from trl_thundersync.envs.runtimes.local import LocalSubprocessSandbox
from trl_thundersync.envs.tasks.grading import copy_task_files
from trl_thundersync.envs.tasks.records import TerminalTask
from trl_thundersync.envs.tasks.suites import load_swe_suite
from trl_thundersync.envs.tasks.swe_files import materialize_reference, materialize_start


def listing(root: Path) -> list[str]:
    """Every file, link and directory under `root`, relative, sorted."""
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)


def without_bytecode(paths: list[str]) -> list[str]:
    return [p for p in paths if "__pycache__" not in Path(p).parts and not p.endswith(".pyc")]


def compiled_copy(source: Path, dest: Path) -> Path:
    """`source` copied to `dest` and byte-compiled as pip compiles an installed wheel."""
    shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    assert compileall.compile_dir(dest, quiet=1)
    assert any(p.name == "__pycache__" for p in dest.rglob("*")), "nothing was compiled"
    return dest


def test_copy_task_files_leaves_out_bytecode_only(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("X = 1\n")
    (source / "data.txt").write_text("data\n")
    (source / "link.py").symlink_to("pkg/mod.py")
    compiled_copy(source, tmp_path / "compiled")
    (tmp_path / "compiled" / "legacy.pyc").write_bytes(b"\0")  # a .pyc beside its source (Python 2 style)
    dest = tmp_path / "dest"
    copy_task_files(tmp_path / "compiled", dest)
    assert listing(dest) == ["data.txt", "link.py", "pkg", "pkg/mod.py"] == listing(source)
    assert os.readlink(dest / "link.py") == "pkg/mod.py"  # links stay links, as copy_tree keeps them


def test_swe_workspace_and_reference_from_a_compiled_copy_match_the_sources(tmp_path: Path) -> None:
    task = load_swe_suite()["bisect_insert_end"]
    installed = compiled_copy(task.repo_dir.parent, tmp_path / "installed")
    compiled = dataclasses.replace(task, repo_dir=installed / "repo", solution_dir=installed / "solution")
    start, reference = tmp_path / "start", tmp_path / "reference"
    start.mkdir()
    reference.mkdir()
    materialize_start(compiled, start)
    materialize_reference(compiled, reference, compiled.repo_dir)
    expected = without_bytecode(listing(task.repo_dir))  # the checkout's tree (minus any local test-run bytecode)
    assert listing(start) == expected
    assert listing(reference) == sorted({*expected, *without_bytecode(listing(task.solution_dir))})


def test_terminal_workspace_from_a_compiled_copy_holds_only_the_task_files(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "tool.py").write_text("print('hi')\n")
    compiled_copy(files, tmp_path / "installed-files")
    task = TerminalTask(task_id="compiled_files", instruction="run tool.py", verifier_file=tmp_path / "test_x.py",
                        solution_script="true", files_dir=tmp_path / "installed-files")
    with TerminalTaskEnv(tasks=[task], sandbox_factory=LocalSubprocessSandbox) as env:
        env.reset(task_id="compiled_files")
        assert env.workspace is not None and listing(env.workspace) == ["tool.py"]
