"""Bubblewrap sandbox: runs an agent's shell commands in one workspace, isolated and bounded.

`BwrapSandbox` implements `sandbox_api.Sandbox` with bubblewrap (Debian package `bubblewrap`, >= 0.8);
`make_sandbox()` picks a backend by name. Every `run()` builds a fresh sandbox:

    [as root: /bin/sh joins a per-command pids cgroup] → bwrap (namespaces, mounts)
        → launcher (`sys.executable -I -S`: rlimits, "started" handshake) → /bin/sh -c COMMAND

Commands run as uid/gid 1000 without capabilities in new user, pid, ipc, uts, cgroup and (unless `limits.network`)
network namespaces. The root is an empty tmpfs remounted read-only; /usr, /bin, /lib*, /sbin, /etc and the
interpreter's prefixes (`sys.prefix`, `sys.base_prefix`, at their host paths, so `python3 -m pytest` runs with the
project's packages) are bound read-only; /tmp and /dev/shm are fresh tmpfs mounts of at most `tmp_bytes`; the
workspace is bound read-write at `workdir`, the working directory. The environment is cleared, then HOME=/tmp,
TMPDIR=/tmp, LANG=C.UTF-8, PATH (interpreter's bin dir first) and the caller's `env` are set.

The launcher sets RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC and RLIMIT_CORE=0. The kernel does not enforce
RLIMIT_NPROC for host uid 0, and for a root caller bubblewrap maps the sandbox uid to host uid 0; so as root each
command also runs in its own pids cgroup (v1 `pids` hierarchy, or v2 with `pids` in `cgroup.subtree_control`) capped
at `max_processes` tasks, and construction fails if none is writable. The timeout SIGKILLs bwrap's process group;
`--die-with-parent` then kills the sandbox's pid 1, and the kernel kills the rest of its pid namespace. A signal
inside shows as exit code 128+N (bwrap's reaper reports it so); `CommandResult.signal` is set only when the sandbox
itself was killed (timeout or `close()`).

What the sandbox protects against and what it does not
------------------------------------------------------
Protects against (each checked by tests/unit/test_sandbox.py, as root, Linux 6.18, bubblewrap 0.8):
- network egress: loopback only (1.1.1.1:80 fails, 127.0.0.1 works); writes anywhere but the workspace;
- reading host files: all but the paths above are absent (/work, /root, /home, the host /tmp, ...); /etc entries
  other users may not read (/etc/shadow, ...) are masked, since as root the sandbox uid owns host root's files;
- fork bombs (pids cgroup as root, else RLIMIT_NPROC), runaway CPU, memory, file size, output and wall time;
  nothing a command starts outlives `run()`.
Does not protect against:
- kernel, bubblewrap or CPU bugs (shared kernel, no seccomp filter); side channels (timing, load, host-wide /proc
  files such as meminfo);
- as root: root-owned, not world-readable files under /usr or the interpreter prefixes (only /etc is scanned);
- untested here: the non-root RLIMIT_NPROC path (checked once by hand with setpriv) and cgroup v2 discovery;
- memory in aggregate: RLIMIT_AS is per process (N processes may use N × memory_bytes), plus `tmp_bytes` in each
  of /tmp and /dev/shm; no memory cgroup is used. Disk use in the workspace: RLIMIT_FSIZE caps files, not their count;
- with `network=True`: the host's whole network, including its abstract unix sockets.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import select
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from ..errors import ConfigurationError
from .sandbox_api import CommandResult, Sandbox, SandboxError, SandboxLimits

SANDBOX_UID = 1000  # uid and gid commands run as; bubblewrap maps it to the caller's host uid
_SYSTEM_PATHS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin", "/etc")
_MASKED_ROOT = "/etc"  # scanned for entries other users may not read
_BWRAP_TASKS = 2  # bwrap outside and its reaper (pid 1) inside: counted by the pids cgroup
_REAPER_TASKS = 1  # the reaper runs as the sandbox uid: counted by RLIMIT_NPROC
_READ_CHUNK = 1 << 16
_EXIT_GRACE_S = 5.0  # once bwrap has exited the namespace is torn down; its pipes must close this fast
_CGROUP_RELEASE_S = 2.0  # how long a finished command's cgroup may take to become removable

# Runs inside the sandbox as `python -I -S -c _LAUNCHER READY_FD CPU MEM NPROC FSIZE COMMAND`. Writing to READY_FD
# proves bwrap's setup succeeded, so a bwrap failure is never mistaken for the command exiting 1.
_LAUNCHER = """\
import os, resource as r, sys
fd, cpu, mem, nproc, fsize, command = sys.argv[1:]
for kind, soft, hard in ((r.RLIMIT_CPU, int(cpu), int(cpu) + 1), (r.RLIMIT_AS, int(mem), int(mem)),
                         (r.RLIMIT_NPROC, int(nproc), int(nproc)), (r.RLIMIT_FSIZE, int(fsize), int(fsize)),
                         (r.RLIMIT_CORE, 0, 0)):
    ceiling = r.getrlimit(kind)[1]
    r.setrlimit(kind, tuple(v if ceiling == r.RLIM_INFINITY else min(v, ceiling) for v in (soft, hard)))
os.write(int(fd), b"1")
os.close(int(fd))
os.execv("/bin/sh", ["/bin/sh", "-c", command])
"""


class _BoundedCapture:
    """Keeps the first and the last `limit // 2` bytes of a stream and counts the bytes that fall between."""

    def __init__(self, limit: int) -> None:
        self._head_cap = limit // 2
        self._tail_cap = limit - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self.error: OSError | None = None  # a read failure, re-raised by run() rather than lost in the thread

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self._tail_cap:
            self._tail += chunk[-self._tail_cap :]
            del self._tail[: max(0, len(self._tail) - self._tail_cap)]

    @property
    def elided(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    def text(self) -> str:
        if not self.elided:
            return (self._head + self._tail).decode("utf-8", errors="replace")
        head, tail = (part.decode("utf-8", errors="replace") for part in (self._head, self._tail))
        return f"{head}\n[... {self.elided} bytes elided ...]\n{tail}"


def _feed(stream: BinaryIO, data: bytes) -> None:
    """Write a command's stdin, then close it; a command that exits without reading it is not an error."""
    with contextlib.suppress(BrokenPipeError, OSError):
        with stream:
            stream.write(data)


def _drain(stream: BinaryIO, capture: _BoundedCapture) -> None:
    try:
        while chunk := os.read(stream.fileno(), _READ_CHUNK):
            capture.feed(chunk)
    except OSError as error:
        capture.error = error


# ---------------------------------------------------------------- host discovery (cached per process)


def _find_bwrap() -> str:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bubblewrap (`bwrap`) is not on PATH: install the Debian package `bubblewrap`")
    return bwrap


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
def _system_mount_args() -> tuple[str, ...]:
    args: list[str] = []
    for path in _SYSTEM_PATHS:
        if os.path.islink(path):  # merged-/usr systems: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path, is_dir in _masked_entries(_MASKED_ROOT):
        args += ["--tmpfs", path, "--remount-ro", path] if is_dir else ["--ro-bind", "/dev/null", path]
    return tuple(args)


def _namespace_args(network: bool) -> list[str]:
    uid = str(SANDBOX_UID)
    args = ["--unshare-user", "--uid", uid, "--gid", uid, "--disable-userns", "--unshare-ipc", "--unshare-pid"]
    args += ["--unshare-uts", "--hostname", "sandbox", "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    return args + ["--cap-drop", "ALL"] + ([] if network else ["--unshare-net"])


def _interpreter_paths() -> tuple[str, ...]:
    """The interpreter's prefixes not already under a system path, outermost only, bound at their host paths."""
    candidates = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    kept: list[str] = []
    for prefix in sorted({os.path.abspath(p) for p in candidates}):
        if not any(prefix == p or prefix.startswith(p.rstrip("/") + "/") for p in (*_SYSTEM_PATHS, *kept)):
            kept.append(prefix)
    return tuple(kept)


@functools.cache
def _bwrap_probe_error(bwrap: str) -> str | None:
    """Why bwrap cannot build our sandbox here (None when it can): one trial run per process."""
    argv = [bwrap, *_namespace_args(network=False), *_system_mount_args(), "--proc", "/proc", "--dev", "/dev"]
    try:
        done = subprocess.run(
            [*argv, "--remount-ro", "/", "/bin/sh", "-c", "true"], capture_output=True, timeout=30, env={}, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"


@functools.cache
def _pids_cgroup_parent() -> Path | None:
    """A writable cgroup directory of this process whose children may set `pids.max`, or None."""
    own = {}  # hierarchy key ("pids" or "" for cgroup v2) -> this process's cgroup path in it
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        mount_root, mount_point = fields.split()[3:5]
        fstype, _, options = (tail.split() + ["", ""])[:3]
        key = "pids" if fstype == "cgroup" and "pids" in options.split(",") else "" if fstype == "cgroup2" else None
        if key is None or key not in own:
            continue
        relative = os.path.relpath(own[key], mount_root)
        if relative.startswith(".."):
            continue
        directory = Path(mount_point, relative)
        if not directory.is_dir():
            continue
        delegated = key == "pids" or "pids" in (directory / "cgroup.subtree_control").read_text().split()
        if delegated and os.access(directory, os.W_OK):
            return directory
    return None


class _PidsCgroup:
    """A per-command pids cgroup capping the number of tasks; used as root, where RLIMIT_NPROC is not enforced."""

    def __init__(self, parent: Path, max_tasks: int) -> None:
        self.path = parent / f"trl_thundersync-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            self.path.mkdir()
            (self.path / "pids.max").write_text(str(max_tasks))
        except OSError as error:
            self.remove()
            raise SandboxError(f"cannot create the pids cgroup {self.path}: {error}") from error

    def join_prefix(self) -> list[str]:
        """A host shell that moves itself into the cgroup, then execs the rest of the argv (bwrap)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def remove(self) -> None:
        deadline = time.monotonic() + _CGROUP_RELEASE_S
        while self.path.exists():
            try:
                self.path.rmdir()
            except OSError as error:  # EBUSY: tasks still being released, or (never seen) left running
                if time.monotonic() > deadline:
                    raise SandboxError(f"cgroup {self.path} still holds tasks after the command ended") from error
                for pid in (self.path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):  # already gone
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.01)


def _check_limits(limits: SandboxLimits) -> None:
    lowest = {"cpu_time_s": 1, "memory_bytes": 1, "max_processes": 1, "max_file_bytes": 0, "output_bytes": 0}
    for field, low in lowest.items():
        if getattr(limits, field) < low:
            raise ConfigurationError(f"SandboxLimits.{field}={getattr(limits, field)!r} is too small: use >= {low}")
    if not limits.timeout_s > 0:
        raise ConfigurationError(f"SandboxLimits.timeout_s={limits.timeout_s!r} must be positive")


# ---------------------------------------------------------------- the sandbox


class BwrapSandbox:
    """A `Sandbox` backed by bubblewrap. Thread-safe: concurrent `run()` calls get separate sandboxes."""

    def __init__(
        self,
        workspace: str | Path,
        limits: SandboxLimits = SandboxLimits(),
        *,
        workdir: str = "/workspace",
        extra_ro_binds: Sequence[str | Path] = (),
        tmp_bytes: int = 256 << 20,  # size cap of each of /tmp and /dev/shm inside
    ) -> None:
        _check_limits(limits)
        if not workdir.startswith("/") or os.path.normpath(workdir) == "/":
            raise ConfigurationError(f"workdir={workdir!r} must be an absolute path other than '/'")
        if tmp_bytes < 1:
            raise ConfigurationError(f"tmp_bytes={tmp_bytes!r} must be at least 1")
        self.workspace = Path(workspace).absolute()
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} does not exist or is not a directory")
        self.workdir = os.path.normpath(workdir)
        self.limits = limits
        self._tmp_bytes = tmp_bytes
        self._bwrap = _find_bwrap()
        if (error := _bwrap_probe_error(self._bwrap)) is not None:
            raise SandboxError(
                f"bubblewrap ({self._bwrap}) cannot create a sandbox here: {error}. It needs user namespaces "
                "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1 where that exists) and, "
                "in a container, a seccomp/AppArmor profile that allows them."
            )
        missing = [str(p) for p in extra_ro_binds if not Path(p).exists()]
        if missing:
            raise SandboxError(f"extra_ro_binds paths do not exist: {missing}")
        self._ro_binds = _interpreter_paths() + tuple(str(Path(p).absolute()) for p in extra_ro_binds)
        self._cgroup_parent = self._process_cap_cgroup()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    def _process_cap_cgroup() -> Path | None:
        if os.geteuid() != 0:
            return None  # the sandbox uid maps to our non-root uid, for which RLIMIT_NPROC is enforced
        parent = _pids_cgroup_parent()
        if parent is None:
            raise SandboxError(
                "running as root: the kernel does not enforce RLIMIT_NPROC for uid 0, so fork bombs need a pids "
                "cgroup, and no writable one was found (cgroup v1 'pids' hierarchy, or cgroup v2 with pids in "
                "cgroup.subtree_control). Run as a non-root user or delegate a pids cgroup to this process."
            )
        _PidsCgroup(parent, 1).remove()  # fail now, not at the first command, if cgroups are not writable
        return parent

    def _argv(self, command: str, ready_fd: int, env: dict[str, str] | None) -> list[str]:
        size = str(self._tmp_bytes)
        argv = [self._bwrap, *_namespace_args(self.limits.network), *_system_mount_args()]
        argv += ["--size", size, "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        for path in self._ro_binds:
            argv += ["--ro-bind", path, path]
        argv += ["--bind", str(self.workspace), self.workdir, "--remount-ro", "/", "--chdir", self.workdir]
        argv.append("--clearenv")
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        for key, value in {"PATH": path, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", **(env or {})}.items():
            argv += ["--setenv", key, value]
        limits = self.limits
        numbers = (limits.cpu_time_s, limits.memory_bytes, limits.max_processes + _REAPER_TASKS, limits.max_file_bytes)
        return [*argv, "--", sys.executable, "-I", "-S", "-c", _LAUNCHER, str(ready_fd), *map(str, numbers), command]

    def run(
        self, command: str, *, timeout_s: float | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ConfigurationError(f"timeout_s={timeout_s!r} must be positive")
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} no longer exists")
        with contextlib.ExitStack() as cleanup:
            prefix: list[str] = []
            if self._cgroup_parent is not None:
                cgroup = _PidsCgroup(self._cgroup_parent, self.limits.max_processes + _BWRAP_TASKS)
                cleanup.callback(cgroup.remove)
                prefix = cgroup.join_prefix()
            ready_read, ready_write = os.pipe()
            cleanup.callback(os.close, ready_read)
            start = time.monotonic()
            try:
                proc = self._start([*prefix, *self._argv(command, ready_write, env)], ready_write, stdin is not None)
            finally:
                os.close(ready_write)  # bwrap holds its copy; ours must go so the handshake pipe can reach EOF
            if stdin is not None:
                threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
            return self._collect(proc, command, timeout, ready_read, start)

    def _start(self, argv: list[str], ready_write: int, with_stdin: bool) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            try:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env={"PATH": "/usr/bin:/bin"}, cwd="/", pass_fds=(ready_write,), start_new_session=True,
                )  # fmt: skip
            except OSError as error:
                raise SandboxError(f"cannot start bubblewrap: {error}") from error
            self._running.add(proc)
        return proc

    def _collect(
        self, proc: subprocess.Popen[bytes], command: str, timeout: float, ready_read: int, start: float
    ) -> CommandResult:
        captures = (_BoundedCapture(self.limits.output_bytes), _BoundedCapture(self.limits.output_bytes))
        streams = (proc.stdout, proc.stderr)
        readers = [threading.Thread(target=_drain, args=pair, daemon=True) for pair in zip(streams, captures)]
        for reader in readers:
            reader.start()
        timed_out = False
        try:
            timed_out = not _wait_for_exit(proc, timeout)
        finally:
            if proc.returncode is None:  # timed out, or interrupted (KeyboardInterrupt): kill the whole tree
                _kill_group(proc)
                proc.wait()
            with self._lock:
                self._running.discard(proc)
        duration = time.monotonic() - start
        for reader in readers:
            reader.join(_EXIT_GRACE_S)
        if any(reader.is_alive() for reader in readers):
            raise SandboxError(f"output pipes stayed open {_EXIT_GRACE_S}s after bubblewrap exited: a process escaped")
        for stream in streams:
            stream.close()  # type: ignore[union-attr]
        for capture in captures:
            if capture.error is not None:
                raise SandboxError(f"reading the command's output failed: {capture.error}") from capture.error
        if not _was_started(ready_read):
            raise SandboxError(f"bubblewrap failed before running the command: {captures[1].text().strip()}")
        code = proc.returncode
        return CommandResult(
            command=command,
            exit_code=None if timed_out or code < 0 else code,
            stdout=captures[0].text(),
            stderr=captures[1].text(),
            duration_s=duration,
            timed_out=timed_out,
            truncated_bytes=captures[0].elided + captures[1].elided,
            signal=signal.SIGKILL.value if timed_out else (-code if code < 0 else None),
        )

    def close(self) -> None:
        """Kill every running command (its whole process tree); later `run()` calls raise. The workspace is kept.

        Returns once each bwrap has exited; the `run()` call that owned a command returns only after the teardown.
        """
        with self._lock:
            self._closed = True
            running = list(self._running)
        for proc in running:
            _kill_group(proc)
            proc.wait()

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL bwrap's process group; `--die-with-parent` then takes down the sandbox's pid namespace."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # exited between poll() and killpg()
            os.killpg(proc.pid, signal.SIGKILL)


def _was_started(ready_read: int) -> bool:
    os.set_blocking(ready_read, False)
    try:
        return os.read(ready_read, 1) == b"1"
    except BlockingIOError:
        return False


def make_sandbox(
    workspace: str | Path, limits: SandboxLimits = SandboxLimits(), backend: str = "bwrap", **kwargs: object
) -> Sandbox:
    """Build a sandbox by backend name; `kwargs` go to the backend's constructor (for bwrap: workdir, ...)."""
    if backend == "bwrap":
        return BwrapSandbox(workspace, limits, **kwargs)  # type: ignore[arg-type]
    if backend == "docker":
        raise SandboxError("Docker backend not available here: only backend='bwrap' is implemented")
    raise ConfigurationError(f"backend={backend!r} is not a sandbox backend: use 'bwrap'")


def _wait_for_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until `proc` exits (True) or `timeout` seconds pass (False). Blocks on a pidfd, so a short command returns
    as soon as it ends; `Popen.wait(timeout)` polls with sleeps of up to 50 ms, which dominated short tool calls."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # no pidfd (kernel < 5.3): the polling wait, same result
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not ready:
        return False
    proc.wait()
    return True
