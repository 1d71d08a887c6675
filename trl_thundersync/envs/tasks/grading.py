"""Grading helpers shared by the task environments: bounded and safe host-side file copies, rewards.

Grading always happens in a fresh host copy of the agent's workspace, so nothing the agent left running can
touch it. The copy of the agent's files is bounded (`GradingLimits`, inside the grading time budget): a workspace
too large or too slow to copy is the attempt's failure (`UngradableWorkspace`), never a hang. Host-side writes into
that copy never follow a symlink the agent planted (`restore_file`), and the host reads nothing the agent could have
written but the workspace itself, without following links: test outcomes come over the runner's channel
(`pytest_channel`). `UngradableWorkspace` (envs/errors.py) and `remove_path` (runtimes/workspace.py) are
importable from here too, as before.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigurationError
from ..errors import UngradableWorkspace
from ..runtimes.workspace import remove_path

# pytest's documented exit codes: 0 all passed, 1 some tests failed; 2 interrupted (e.g. collection errors),
# 3 internal error, 4 usage error (e.g. a node id not found), 5 no tests collected.
PYTEST_TESTS_RAN = (0, 1)

# Report flags appended to every grading pytest run: one summary line per test (failed, error, passed, skipped,
# xfail, xpass) and no tracebacks, so the log kept for humans stays short. Never parsed for outcomes.
PYTEST_REPORT_FLAGS = ("-rfEpsxX", "--tb=no")

PASSING_OUTCOMES = frozenset({"PASSED", "XFAIL"})  # SWE-bench counts an expected failure as a pass
FAILING_OUTCOMES = frozenset({"FAILED", "ERROR", "XPASS"})


@dataclass(frozen=True)
class GradingLimits:
    """Bounds on the grading copy of an agent's workspace; the copy also counts inside `grade_timeout_s`."""

    max_entries: int = 50_000  # files, directories and links; an SWE-bench checkout has a few thousand
    max_bytes: int = 1 << 30  # sum of regular file sizes (each hard link counts in full: each is copied)
    max_path_chars: int = 1024  # longest workspace-relative path (far below PATH_MAX for every later walk)

    def __post_init__(self) -> None:
        for name in ("max_entries", "max_bytes", "max_path_chars"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"GradingLimits.{name}={getattr(self, name)!r} must be at least 1")


@dataclass(frozen=True)
class GradeReport:
    """The outcome of grading one attempt."""

    reward: float | None  # None only for an infrastructure failure (then `infra_error` says why)
    detail: str  # one line for humans: what decided the reward
    outcomes: dict[str, str] = field(default_factory=dict)  # node id -> pytest outcome (PASSED, FAILED, ...)
    exit_code: int | None = None  # exit code of the grading pytest run (None: timed out or killed)
    log_tail: str = ""  # end of the grading log, for debugging
    infra_error: str | None = None  # set iff reward is None


def seta_reward(passed: int, total: int) -> float:
    """SETA reward: the fraction p of verifier checks passed, plus a 0.5 bonus when every check passed."""
    if total <= 0:
        raise ValueError(f"seta_reward needs at least one check, got total={total}")
    p = passed / total
    return p + 0.5 * (passed == total)


def swe_reward(outcomes: dict[str, str], fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...]) -> float:
    """1.0 iff every FAIL_TO_PASS test passes and no PASS_TO_PASS test fails, else 0.0."""
    fixed = all(outcomes.get(t) in PASSING_OUTCOMES for t in fail_to_pass)
    kept = not any(outcomes.get(t) in FAILING_OUTCOMES for t in pass_to_pass)
    return 1.0 if fixed and kept else 0.0


def _skip_special(directory: str, names: list[str]) -> list[str]:
    """copytree ignore hook: skip FIFOs, sockets and devices (reading a FIFO would block the grader)."""
    skipped = []
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            skipped.append(name)
    return skipped


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a directory tree into `dst` (created or merged), keeping symlinks as links and modes as they are."""
    shutil.copytree(src, dst, symlinks=True, ignore=_skip_special, dirs_exist_ok=True)


_BYTECODE = shutil.ignore_patterns("__pycache__", "*.pyc")


def _skip_special_and_bytecode(directory: str, names: list[str]) -> set[str]:
    return {*_skip_special(directory, names), *_BYTECODE(directory, names)}


def copy_task_files(src: Path, dst: Path) -> None:
    """Copy a task's own files (a starting tree, a solution overlay, input files) into `dst` like `copy_tree`, but
    without `__pycache__` folders and `.pyc` files: pip compiles an installed wheel's .py files, bundled task data
    included, so an installed copy holds bytecode the checkout does not (and a task never ships any)."""
    shutil.copytree(src, dst, symlinks=True, ignore=_skip_special_and_bytecode, dirs_exist_ok=True)


def copy_workspace(src: Path, dst: Path, limits: GradingLimits, deadline: float) -> None:
    """Copy an agent's workspace into the existing directory `dst`, within `limits` and before `deadline`
    (time.monotonic()); raises `UngradableWorkspace` as soon as a bound is passed.

    Like `copy_tree`: links are copied as links (never followed), modes and times are kept, FIFOs, sockets and
    devices are skipped. The tree is measured first (names and lstat only), so an over-size workspace is refused
    before anything is copied; iterative, so no depth of nesting can exhaust the stack.
    """
    entries = _inventory(src, limits, deadline)
    directories = []  # modes and times applied last, deepest first: a read-only directory stays fillable till then
    for rel, info in entries:
        if time.monotonic() > deadline:
            raise UngradableWorkspace("copying the workspace took the whole grading time budget")
        source, target = os.path.join(src, rel), os.path.join(dst, rel)
        if stat.S_ISDIR(info.st_mode):
            os.mkdir(target, 0o700)
            directories.append((target, info))
        elif stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(source), target)
        else:
            try:
                shutil.copy2(source, target, follow_symlinks=False)
            except PermissionError as exc:  # the agent's own commands (same uid) made it unreadable
                raise UngradableWorkspace(f"a workspace file cannot be read: {exc}") from exc
    for target, info in reversed(directories):
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
        os.chmod(target, stat.S_IMODE(info.st_mode))


def _inventory(src: Path, limits: GradingLimits, deadline: float) -> list[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every directory, link and regular file under `src`, parents before children."""
    found: list[tuple[str, os.stat_result]] = []
    size = 0
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            listing = os.scandir(os.path.join(src, rel_dir))
        except PermissionError as exc:  # the agent's own commands (same uid) made it unreadable
            raise UngradableWorkspace(f"the workspace directory {rel_dir or '.'!r} cannot be read: {exc}") from exc
        with listing:
            for entry in listing:
                rel = os.path.join(rel_dir, entry.name)
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    pending.append(rel)
                elif stat.S_ISREG(info.st_mode):
                    size += info.st_size
                elif not stat.S_ISLNK(info.st_mode):
                    continue  # FIFO, socket, device: not copied (reading a FIFO would block the grader)
                found.append((rel, info))
                if len(found) > limits.max_entries:
                    raise UngradableWorkspace(f"the workspace holds more than {limits.max_entries} files and "
                                              "directories")
                if size > limits.max_bytes:
                    raise UngradableWorkspace(f"the workspace holds more than {limits.max_bytes} bytes of files")
                if len(rel) > limits.max_path_chars:
                    raise UngradableWorkspace(f"a workspace path is longer than {limits.max_path_chars} characters")
                if time.monotonic() > deadline:
                    raise UngradableWorkspace("copying the workspace took the whole grading time budget")
    return found


def check_relative(rel: str, where: str) -> str:
    """Reject absolute paths and `..` in a repo-relative path taken from task data."""
    parts = Path(rel).parts
    if not rel or Path(rel).is_absolute() or ".." in parts:
        raise ValueError(f"{where}: {rel!r} is not a plain repo-relative path")
    return rel


def _real_parents(root: Path, rel: str) -> Path:
    """Make every parent directory of `root/rel` a real directory (replacing links/files the agent planted)."""
    current = root
    for part in Path(rel).parts[:-1]:
        current = current / part
        if current.is_symlink() or (os.path.lexists(current) and not current.is_dir()):
            current.unlink()
        current.mkdir(exist_ok=True)
    return current / Path(rel).name


def restore_file(root: Path, source_root: Path, rel: str) -> None:
    """Make `root/rel` identical to `source_root/rel`, or absent when the source lacks it."""
    dest = _real_parents(root, rel)
    remove_path(dest)
    source = source_root / rel
    if source.is_dir():
        shutil.copytree(source, dest, symlinks=True)
    elif source.is_file():
        shutil.copy2(source, dest)


def tail(text: str, chars: int = 2000) -> str:
    return text if len(text) <= chars else "..." + text[-chars:]
