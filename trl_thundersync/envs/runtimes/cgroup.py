"""Per-command cgroups for the bubblewrap sandbox: a task cap (pids) and a memory cap for the whole command tree.

Used as root, where the kernel enforces neither RLIMIT_NPROC (uid 0) nor anything in aggregate (RLIMIT_AS is per
process). `cgroup_parents()` finds, for each controller, a writable cgroup directory of this process whose children
get that controller: a cgroup v1 hierarchy mounted with it, or the v2 hierarchy with it in `cgroup.subtree_control`.
`CommandCgroup` creates one child per hierarchy (one directory on v2, one per controller on v1), sets

    pids.max                                        (v1 and v2)
    memory.max, memory.swap.max = 0                 (v2)
    memory.limit_in_bytes = memory.memsw.limit_in_bytes   (v1; memsw only where swap accounting exists)

and prefixes the bwrap argv with a host shell that moves itself into every child before exec'ing bwrap, so bwrap,
its reaper and everything the command starts are counted. After the command, `oom_kills()` reads how many
processes the kernel's OOM killer took for the memory cap (`oom_kill` of memory.events / memory.oom_control).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
import uuid
from pathlib import Path

from ..errors import SandboxError

CONTROLLERS = ("pids", "memory")
_RELEASE_S = 2.0  # how long a finished command's cgroup may take to become removable


@functools.cache
def cgroup_parents() -> dict[str, Path]:
    """controller -> a writable cgroup directory of this process whose children get that controller."""
    return find_parents(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())


def find_parents(proc_cgroup: str, mountinfo: str) -> dict[str, Path]:
    """`cgroup_parents` from the text of /proc/self/cgroup and /proc/self/mountinfo."""
    own = {}  # hierarchy key (a v1 controller name, or "" for cgroup v2) -> this process's cgroup path in it
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    found: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        mount_root, mount_point = fields.split()[3:5]
        fstype, _, options = (tail.split() + ["", ""])[:3]
        for controller in CONTROLLERS:
            if controller in found:
                continue
            key = controller if fstype == "cgroup" and controller in options.split(",") else (
                "" if fstype == "cgroup2" else None)
            if key is None or key not in own:
                continue
            relative = os.path.relpath(own[key], mount_root)
            directory = Path(mount_point, relative)
            if relative.startswith("..") or not directory.is_dir():
                continue
            delegated = key == controller or controller in (directory / "cgroup.subtree_control").read_text().split()
            if delegated and os.access(directory, os.W_OK):
                found[controller] = directory
    return found


class CommandCgroup:
    """One command's cgroups: `max_tasks` tasks and (unless None) `memory_bytes` of memory, no swap, for the tree."""

    def __init__(self, parents: dict[str, Path], max_tasks: int, memory_bytes: int | None) -> None:
        wanted = {"pids": str(max_tasks)}
        if memory_bytes is not None:
            wanted["memory"] = str(memory_bytes)
        name = f"trl_thundersync-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.paths: dict[str, Path] = {c: parents[c] / name for c in wanted}  # controller -> its child cgroup
        try:
            for path in dict.fromkeys(self.paths.values()):  # v2: one directory serves both controllers
                path.mkdir()
            (self.paths["pids"] / "pids.max").write_text(wanted["pids"])
            if memory_bytes is not None:
                _set_memory(self.paths["memory"], memory_bytes)
        except OSError as error:
            self.remove()
            raise SandboxError(f"cannot set up the command's cgroup {name}: {error}") from error

    def join_prefix(self) -> list[str]:
        """A host shell that moves itself into every child cgroup, then execs the rest of the argv (bwrap)."""
        procs = [str(path / "cgroup.procs") for path in dict.fromkeys(self.paths.values())]
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 1; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *procs, "--"]

    def oom_kills(self) -> int:
        """Processes the OOM killer took for this cgroup's memory cap (0 without a memory cap, or before 4.13)."""
        path = self.paths.get("memory")
        if path is None:
            return 0
        events = path / "memory.events" if (path / "memory.events").exists() else path / "memory.oom_control"
        try:
            lines = events.read_text().splitlines()
        except OSError as error:
            raise SandboxError(f"cannot read the command's OOM count from {events}: {error}") from error
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        for path in dict.fromkeys(self.paths.values()):
            _remove(path)


def _set_memory(path: Path, memory_bytes: int) -> None:
    if (path / "memory.max").exists():  # cgroup v2
        (path / "memory.max").write_text(str(memory_bytes))
        if (path / "memory.swap.max").exists():
            (path / "memory.swap.max").write_text("0")
        return
    (path / "memory.limit_in_bytes").write_text(str(memory_bytes))  # v1: memory first, memsw may not go below it
    if (path / "memory.memsw.limit_in_bytes").exists():
        (path / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))


def _remove(path: Path) -> None:
    deadline = time.monotonic() + _RELEASE_S
    while path.exists():
        try:
            path.rmdir()
        except OSError as error:  # EBUSY: tasks still being released, or (never seen) left running
            if time.monotonic() > deadline:
                raise SandboxError(f"cgroup {path} still holds tasks after the command ended") from error
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):  # already gone
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.01)
