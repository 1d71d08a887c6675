"""What the bubblewrap sandbox mounts, worked out from the host once per process: bwrap arguments only, no running.

- `system_mount_args()`: /usr, /bin, /lib*, /sbin, /etc read-only; /etc entries other users may not read masked.
- `proc_cover_args()`: /proc is a fresh procfs, but its global entries are the host kernel's; as root the sandbox
  uid *is* host uid 0 to the permission checks, so every top-level /proc entry that holds something writable
  (/proc/sys, /proc/sysrq-trigger, /proc/irq, /proc/bus, /proc/pressure, /proc/mtrr, ...) is bound read-only and
  every one other users may not read (/proc/kmsg, /proc/kcore, /proc/timer_list, /proc/slabinfo, ...) is masked.
  Per-process entries (/proc/<pid>, self, thread-self, and links into them such as /proc/net) are the sandbox's own.
- `interpreter_paths()`: the interpreter's prefixes, bound read-only at their host paths.
- `user_site()`: the user site (`pip install --user`) when this interpreter imports from it, also bound read-only
  (the package or its dependencies, pytest among them, may live only there); commands inside get its base as
  PYTHONUSERBASE, and the grading runner, which runs `python3 -I` (no user site), adds it itself.
- `hidden_mount_args()`: empty read-only covers over paths that must not be readable inside although they lie
  under a bound path: by default `task_data_dirs()`, the bundled suites' answers (reference solutions, hidden
  verifiers) of every copy of this package under a bound path (a wheel or system install puts them under
  site-packages, which is part of an interpreter prefix, or in the user site). A cover under another cover is
  dropped: the outer one hides it already, and bwrap cannot make its mount point inside the outer, read-only one.
"""

from __future__ import annotations

import functools
import glob
import os
import site
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SYSTEM_PATHS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin", "/etc")
_MASKED_ROOT = "/etc"  # scanned for entries other users may not read
_PROC_OWN = ("self", "thread-self")  # besides /proc/<pid>: the sandbox's own processes
# The package data of pyproject's [tool.setuptools.package-data], relative to the package directory.
_TASK_DATA = ("envs/tasks/swe", "envs/tasks/terminal")
_PACKAGE_DIR = Path(__file__).resolve().parents[2]  # this copy of trl_thundersync (this file: envs/runtimes/)


def _mask_args(path: str, is_dir: bool) -> list[str]:
    return ["--tmpfs", path, "--remount-ro", path] if is_dir else ["--ro-bind", "/dev/null", path]


@functools.cache
def _masked_entries(root: str) -> tuple[tuple[str, bool], ...]:
    """(path, is_dir) under `root` that other users may not read; hidden because as root the sandbox uid owns them."""
    found: list[tuple[str, bool]] = []
    for directory, subdirs, files in os.walk(root):
        for name in list(subdirs):
            mode = os.lstat(os.path.join(directory, name)).st_mode
            if stat.S_ISDIR(mode) and mode & 0o005 != 0o005:
                found.append((os.path.join(directory, name), True))
                subdirs.remove(name)
        for name in files:
            mode = os.lstat(os.path.join(directory, name)).st_mode
            if stat.S_ISREG(mode) and not mode & stat.S_IROTH:
                found.append((os.path.join(directory, name), False))
    return tuple(found)


@functools.cache
def system_mount_args() -> tuple[str, ...]:
    args: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):  # merged-/usr systems: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path, is_dir in _masked_entries(_MASKED_ROOT):
        args += _mask_args(path, is_dir)
    return tuple(args)


def _holds_writable(path: str) -> bool:
    """Whether `path`, or anything under it, has a write permission bit (host uid 0 passes any owner check)."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        return bool(mode & 0o222)
    for directory, subdirs, files in os.walk(path):
        for name in (*files, *subdirs):
            try:
                mode = os.lstat(os.path.join(directory, name)).st_mode
            except OSError:  # an entry that vanished (an irq, a process) while walking
                continue
            if mode & 0o222 and not stat.S_ISLNK(mode):
                return True
    return False


@functools.cache
def proc_cover_args(proc: str = "/proc") -> tuple[str, ...]:
    """bwrap arguments, after `--proc /proc`, that leave nothing host-global under /proc writable or root-only."""
    args: list[str] = []
    for name in sorted(os.listdir(proc)):
        path = os.path.join(proc, name)
        if name.isdigit() or name in _PROC_OWN or os.path.islink(path):
            continue
        mode = os.lstat(path).st_mode
        inside = f"/proc/{name}"
        if not mode & stat.S_IROTH:
            args += _mask_args(inside, stat.S_ISDIR(mode))
        elif _holds_writable(path):
            args += ["--ro-bind", path, inside]
    return tuple(args)


def interpreter_paths() -> tuple[str, ...]:
    """The interpreter's prefixes not already under a system path, outermost only, bound at their host paths."""
    candidates = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    kept: list[str] = []
    for prefix in sorted({os.path.abspath(p) for p in candidates}):
        if not any(_under(prefix, p) for p in (*SYSTEM_PATHS, *kept)):
            kept.append(prefix)
    return tuple(kept)


@dataclass(frozen=True)
class UserSite:
    """Where `pip install --user` puts packages for this interpreter (PYTHONUSERBASE, or ~/.local by default)."""

    base: str  # the user base; PYTHONUSERBASE inside, so the sandbox's interpreter finds `packages` (not bound itself)
    packages: str  # its site-packages directory, bound read-only at its host path


def user_site() -> UserSite | None:
    """The user site, when this interpreter imports from it (enabled, existing, on sys.path); else None.

    Only the site-packages directory is bound, not the base: the base holds other user files (~/.local/share, ...),
    and an interpreter finds the user site from PYTHONUSERBASE alone (same interpreter, same install scheme).
    """
    if not site.ENABLE_USER_SITE:  # off under -s, -I, PYTHONNOUSERSITE, and in a venv without system site-packages
        return None
    packages = os.path.abspath(site.getusersitepackages())
    if not os.path.isdir(packages) or packages not in {os.path.abspath(p) for p in sys.path if p}:
        return None
    return UserSite(base=os.path.abspath(site.getuserbase()), packages=packages)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@functools.cache
def task_data_dirs(bound: tuple[str, ...]) -> tuple[str, ...]:
    """The bundled task data of this package and of every copy of it installed under a bound path (a prefix, or a
    site-packages directory itself: the user site)."""
    packages = {str(_PACKAGE_DIR)}
    for root in bound:
        for pattern in ("trl_thundersync", "lib*/python3*/*-packages/trl_thundersync",
                        "local/lib*/python3*/*-packages/trl_thundersync"):
            packages.update(glob.glob(os.path.join(root, pattern)))
    return tuple(sorted(os.path.join(p, data) for p in packages for data in _TASK_DATA))


def hidden_mount_args(hidden: Iterable[str], bound: Iterable[str]) -> tuple[str, ...]:
    """Empty read-only covers for each existing `hidden` path that lies under a `bound` path (the rest are absent).

    Paths are compared after resolving symlinks on the host; each cover goes where the path appears inside, i.e.
    under the bound path as bwrap mounts it (bound paths keep their host spelling inside). Only the outermost covers
    are kept: one under another cover is hidden already, and bwrap could not mount it anyway (its mount point lies
    in the outer cover, an empty read-only tmpfs). In a wheel install the environments' per-task answer paths lie
    under the covered task data folders (`task_data_dirs`), so this is the common case, not a corner.
    """
    roots = [(b, os.path.realpath(b)) for b in bound]
    covers: dict[str, bool] = {}  # path inside -> is a directory
    for path in dict.fromkeys(os.path.realpath(h) for h in hidden):
        if not os.path.lexists(path):
            continue
        for inside_root, real_root in roots:
            if _under(path, real_root):
                inside = os.path.normpath(os.path.join(inside_root, os.path.relpath(path, real_root)))
                covers[inside] = os.path.isdir(path)
    return tuple(arg for path in outermost_paths(covers) for arg in _mask_args(path, covers[path]))


def outermost_paths(paths: Iterable[str]) -> tuple[str, ...]:
    """`paths` without duplicates and without any path that lies under another of them, sorted."""
    kept: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):  # parents before their descendants
        if not any(_under(path, outer) for outer in kept):
            kept.append(path)
    return tuple(sorted(kept))
