"""Grading helpers shared by the task environments: safe host-side file copies, pytest report parsing, rewards.

Grading always happens in a fresh host copy of the agent's workspace, so nothing the agent left running can
touch it. Host-side writes into that copy never follow a symlink the agent planted (`restore_file`).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

# pytest's documented exit codes: 0 all passed, 1 some tests failed; 2 interrupted (e.g. collection errors),
# 3 internal error, 4 usage error (e.g. a node id not found), 5 no tests collected.
PYTEST_TESTS_RAN = (0, 1)

# Report flags appended to every grading pytest run: one summary line per test (failed, error, passed, skipped,
# xfail, xpass) and no tracebacks, so the summary stays short.
PYTEST_REPORT_FLAGS = "-rfEpsxX --tb=no"

PASSING_OUTCOMES = frozenset({"PASSED", "XFAIL"})  # SWE-bench counts an expected failure as a pass
FAILING_OUTCOMES = frozenset({"FAILED", "ERROR", "XPASS"})

_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+)$")


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


def parse_summary(log: str, node_ids: tuple[str, ...] | None = None) -> dict[str, str]:
    """Outcomes from pytest's short test summary (`-rfEpsxX`).

    With `node_ids`, a line is matched against the requested ids (which may contain spaces, as parametrized ids
    can); without, the id is the text up to " - " (the failure message separator).
    """
    outcomes: dict[str, str] = {}
    for line in log.splitlines():
        match = _SUMMARY_LINE.match(line.rstrip())
        if not match:
            continue
        status, rest = match.groups()
        if node_ids is None:
            outcomes[rest.split(" - ", 1)[0]] = status
            continue
        for node in node_ids:
            if rest == node or rest.startswith(node + " - "):
                outcomes[node] = status
    return outcomes


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


def check_relative(rel: str, where: str) -> str:
    """Reject absolute paths and `..` in a repo-relative path taken from task data."""
    parts = Path(rel).parts
    if not rel or Path(rel).is_absolute() or ".." in parts:
        raise ValueError(f"{where}: {rel!r} is not a plain repo-relative path")
    return rel


def remove_path(path: Path) -> None:
    """Delete a file, link or directory (no-op when absent); never follows a link."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


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


def read_log(path: Path) -> str:
    """Read a grading log without following a symlink; a missing log reads as empty."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return ""
    with os.fdopen(fd, "rb") as handle:
        return handle.read().decode("utf-8", errors="replace")


def tail(text: str, chars: int = 2000) -> str:
    return text if len(text) <= chars else "..." + text[-chars:]
