"""Bubblewrap sandbox: runs an agent's shell commands in one workspace, isolated and bounded.

`BwrapSandbox` implements `runtimes.api.Sandbox` with bubblewrap (Debian package `bubblewrap`, >= 0.8);
`runtimes.make_sandbox()` picks a backend by name. Every `run()` builds a fresh sandbox:

    [as root: /bin/sh joins the command's pids and memory cgroups] → bwrap (namespaces, mounts)
        → launcher (`runtimes/launcher.py`: `prlimit` + bash, or `sys.executable -I -S` for a command with a NUL
          byte or over 128 KiB: rlimits, "started" handshake, reads the command from a memfd)
        → /bin/sh -c COMMAND   (a command over 128 KiB or with a NUL byte: evaluated by /bin/sh from the memfd)

Commands run as uid/gid 1000 without capabilities in new user, pid, ipc, uts, cgroup and (unless `limits.network`)
network namespaces. The root is an empty tmpfs remounted read-only; /usr, /bin, /lib*, /sbin, /etc and the interpreter's
prefixes (`sys.prefix`, `sys.base_prefix`, at their host paths, so `python3 -m pytest` runs with the project's packages)
and the user site's site-packages when the interpreter imports from it (`mounts.user_site`, `pip install --user`; the
grading runner adds it to its `python3 -I`) are bound read-only; /tmp and /dev/shm are fresh tmpfs mounts of at most
`tmp_bytes`; the workspace is bound read-write at `workdir`, the working directory. /proc is the sandbox's own, but its
host-global entries are covered (`mounts.proc_cover_args`): as root the sandbox uid is host uid 0 to permission checks,
so each one holding anything writable (/proc/sys, sysrq-trigger, irq, bus, pressure, mtrr, ...) is bound read-only and
each one other users may not read (kmsg, kcore, timer_list, slabinfo, ...) is masked. Task answers are covered by empty
read-only mounts wherever they lie under a bound path: this package's bundled suites (a wheel puts their reference
solutions and hidden verifiers under site-packages or the user site) and the caller's `hidden_paths` (only the outermost
covers: one inside another is hidden already). The environment is cleared, then HOME=/tmp, TMPDIR=/tmp, LANG=C.UTF-8,
PATH (interpreter's bin dir first), PYTHONUSERBASE (with a bound user site) and the caller's `env` are set.

The launcher sets RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC and RLIMIT_CORE=0. The kernel does not enforce
RLIMIT_NPROC for host uid 0, and for a root caller bubblewrap maps the sandbox uid to host uid 0; so as root each
command also runs in its own cgroups (`cgroup.py`): pids capped at `max_processes` tasks, and memory capped at
`tree_memory_bytes` for the whole tree (processes, page cache, /tmp and /dev/shm pages; no swap). Construction fails
as root if no writable pids cgroup, or (with a tree cap) no memory cgroup, is found. An OOM kill comes back in the
`CommandResult` (exit code 137 or the shell's report, `oom_kills`, a note in stderr). The timeout SIGKILLs bwrap's
process group; `--die-with-parent` then kills the sandbox's pid 1, and the kernel kills the rest of its pid
namespace. A signal inside shows as exit code 128+N (bwrap's reaper reports it so); `CommandResult.signal` is set
only when the sandbox itself was killed (timeout or `close()`). A command longer than `max_command_bytes` is not run:
exit code 126 and a stderr line the model sees. The workspace disk quota is the workspace's own (a capped tmpfs,
`runtimes/workspace.py`, created so by `ShellTaskEnv` as root), not this class's.

What the sandbox protects against and what it does not
------------------------------------------------------
Protects against (tests in tests/unit/envs/runtimes/: S = test_sandbox.py, H = test_sandbox_hardening.py; as root,
Linux 6.18, bubblewrap 0.8, cgroup v1):
- network egress: loopback only (S test_outbound_network_fails, test_loopback_works_inside,
  test_network_flag_shares_the_host_namespace);
- writes anywhere but the workspace (S test_writes_outside_the_workspace_fail);
- reading host files: all but the paths above are absent, /work, /root, /home, the host /tmp, ... (S
  test_only_system_paths_and_interpreter_prefixes_are_visible, test_host_tmp_and_root_are_not_visible); /etc entries
  other users may not read are masked (S test_etc_secrets_are_masked);
- changing host kernel settings: nothing host-global under /proc is writable, not even with the value it holds, and
  its root-only entries are unreadable (H test_proc_sys_writes_fail_even_with_the_same_value,
  test_nothing_host_global_under_proc_is_writable,
  test_root_only_proc_entries_are_masked_and_net_sysctls_are_the_sandboxes);
- reading task answers: the bundled suites' solutions and verifiers and any `hidden_paths`, wherever installed under
  a bound path (H test_task_data_under_a_bound_prefix_is_hidden, test_the_installed_task_data_is_unreadable_inside,
  test_hidden_paths_argument_covers_files_and_directories,
  test_an_installed_copys_task_answers_are_hidden_and_commands_still_run,
  test_a_user_site_is_bound_with_its_task_data_hidden_and_the_grader_imports_from_it; from a wheel in a fresh venv and
  in a system interpreter's user site: tests/integration/test_wheel_install.py);
- fork bombs: pids cgroup as root, else RLIMIT_NPROC (S test_process_limit_is_enforced, test_fork_bomb_is_contained);
- runaway CPU (S test_cpu_time_limit), memory per process (S test_memory_limit), memory of the whole tree, as root
  (H test_memory_of_the_whole_tree_is_capped), file size (S test_file_size_limit), output
  (S test_huge_output_is_bounded_keeping_head_and_tail, test_both_streams_are_drained_concurrently) and wall time
  (S test_timeout_kills_the_whole_tree);
- disk use of a task workspace, as root: bytes and file count (H test_workspace_quota_bounds_bytes_and_files,
  test_task_env_workspaces_are_quota_mounts_released_with_the_episode);
- a command's size or bytes turning into an infrastructure error: 1 MiB runs, longer than `max_command_bytes` is a
  failed command, NUL bytes and lone surrogates run (H test_a_one_mebibyte_command_runs_with_stdin_free,
  test_long_and_odd_commands_keep_the_shell_semantics, test_a_command_over_max_command_bytes_is_refused_as_a_result);
- anything a command starts outliving `run()` (S test_background_children_die_when_the_command_ends,
  test_timeout_kills_the_whole_tree, test_close_kills_running_commands_and_is_idempotent).
Does not protect against:
- kernel, bubblewrap or CPU bugs (shared kernel, no seccomp filter); side channels (timing, load, host-wide /proc
  files that stay readable: meminfo, loadavg, interrupts, /proc/sys values, ...);
- as root: root-owned, not world-readable files under /usr or the interpreter prefixes (only /etc and the top level
  of /proc are scanned), e.g. root-only entries deeper in /proc/sys (readable, not writable);
- task answers kept anywhere else under a bound path unless passed as `hidden_paths` (only this package's bundled
  suites are hidden by default; the task environments pass each task's `solution_dir` / `verifier_file`,
  H test_a_users_task_answers_under_a_bound_prefix_are_hidden_from_agent_and_grader); the package's code itself
  stays readable;
- processes of one command reading or writing each other's fds: bwrap's pid 1 is dumpable, so the command's own
  stdout/stderr pipes can be reopened through /proc/1/fd (the graders authenticate their records instead);
- without root: no aggregate memory cap (RLIMIT_AS is per process, N processes may use N × memory_bytes, plus
  `tmp_bytes` in each of /tmp and /dev/shm) and no workspace quota (a plain directory: RLIMIT_FSIZE caps each file,
  not their number or sum); untested here: the non-root paths (RLIMIT_NPROC checked once by hand with setpriv) and
  real cgroup v2 (its discovery is tested on synthetic mount tables, tests/unit/envs/runtimes/test_sandbox_cgroup.py;
  memory.max, memory.swap.max and memory.events were not exercised: this host has cgroup v1);
- disk use of a directory that is not a `create_workspace` workspace (the environments' workspaces and grading copies
  are, H test_grading_copies_get_the_workspace_quota);
- with `network=True`: the host's whole network, including its abstract unix sockets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ...errors import ConfigurationError
from ..errors import SandboxError
from .api import CommandResult, SandboxLimits
from .cgroup import CommandCgroup, cgroup_parents
from .launcher import command_memfd, launcher_argv
from .mounts import (
    SYSTEM_PATHS,
    hidden_mount_args,
    interpreter_paths,
    proc_cover_args,
    system_mount_args,
    task_data_dirs,
    user_site,
)
from .process_io import BoundedCapture, drain, feed, kill_group, wait_for_exit, was_started

SANDBOX_UID = 1000  # uid and gid commands run as; bubblewrap maps it to the caller's host uid
_BWRAP_TASKS = 2  # bwrap outside and its reaper (pid 1) inside: counted by the pids cgroup
_REAPER_TASKS = 1  # the reaper runs as the sandbox uid: counted by RLIMIT_NPROC
_EXIT_GRACE_S = 5.0  # once bwrap has exited the namespace is torn down; its pipes must close this fast
_TOO_LONG_EXIT = 126  # exit code of a command refused for its length (the shell's "cannot execute")


# ---------------------------------------------------------------- host discovery (cached per process)


def _find_bwrap() -> str:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bubblewrap (`bwrap`) is not on PATH: install the Debian package `bubblewrap`")
    return bwrap


def _namespace_args(network: bool) -> list[str]:
    uid = str(SANDBOX_UID)
    args = ["--unshare-user", "--uid", uid, "--gid", uid, "--disable-userns", "--unshare-ipc", "--unshare-pid"]
    args += ["--unshare-uts", "--hostname", "sandbox", "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    return args + ["--cap-drop", "ALL"] + ([] if network else ["--unshare-net"])


@functools.cache
def _bwrap_probe_error(bwrap: str) -> str | None:
    """Why bwrap cannot build our sandbox here (None when it can): one trial run per process."""
    argv = [bwrap, *_namespace_args(network=False), *system_mount_args(), "--proc", "/proc", *proc_cover_args()]
    try:
        done = subprocess.run(
            [*argv, "--dev", "/dev", "--remount-ro", "/", "/bin/sh", "-c", "true"], capture_output=True, timeout=30,
            env={}, cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"


# Below this a tree cap would break the sandbox, not bound the command (measured: `true` runs in 4 MiB with bwrap,
# its reaper and the launcher; `python3 -c pass` needs 8 MiB).
_MIN_TREE_MEMORY = 16 << 20


def _check_limits(limits: SandboxLimits) -> None:
    lowest = {"cpu_time_s": 1, "memory_bytes": 1, "max_processes": 1, "max_file_bytes": 0, "output_bytes": 0,
              "max_command_bytes": 1}
    for field, low in lowest.items():
        if getattr(limits, field) < low:
            raise ConfigurationError(f"SandboxLimits.{field}={getattr(limits, field)!r} is too small: use >= {low}")
    if not limits.timeout_s > 0:
        raise ConfigurationError(f"SandboxLimits.timeout_s={limits.timeout_s!r} must be positive")
    if limits.tree_memory_bytes is not None and limits.tree_memory_bytes < _MIN_TREE_MEMORY:
        raise ConfigurationError(
            f"SandboxLimits.tree_memory_bytes={limits.tree_memory_bytes!r} is too small: use >= {_MIN_TREE_MEMORY} "
            "(the sandbox and an interpreter need about 8 MiB), or None for no aggregate cap"
        )


def _cgroup_parents(limits: SandboxLimits) -> dict[str, Path] | None:
    """As root: where each command's cgroups go (pids, and memory unless `tree_memory_bytes` is None); else None."""
    if os.geteuid() != 0:
        return None  # the sandbox uid maps to our non-root uid, for which RLIMIT_NPROC is enforced
    parents = cgroup_parents()
    if "pids" not in parents:
        raise SandboxError(
            "running as root: the kernel does not enforce RLIMIT_NPROC for uid 0, so fork bombs need a pids "
            "cgroup, and no writable one was found (cgroup v1 'pids' hierarchy, or cgroup v2 with pids in "
            "cgroup.subtree_control). Run as a non-root user or delegate a pids cgroup to this process."
        )
    if limits.tree_memory_bytes is not None and "memory" not in parents:
        raise SandboxError(
            "running as root: SandboxLimits.tree_memory_bytes needs a memory cgroup, and no writable one was found "
            "(cgroup v1 'memory' hierarchy, or cgroup v2 with memory in cgroup.subtree_control). Delegate one to "
            "this process, or set SandboxLimits(tree_memory_bytes=None) to keep only the per-process RLIMIT_AS."
        )
    # Fail now, not at the first command, if the cgroups are not writable.
    CommandCgroup(parents, 1, None if limits.tree_memory_bytes is None else _MIN_TREE_MEMORY).remove()
    return parents


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
        hidden_paths: Sequence[str | Path] = (),  # unreadable inside even when under a bound path
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
        user = user_site()
        self._user_env = {} if user is None else {"PYTHONUSERBASE": user.base}
        ro_binds = (*interpreter_paths(), *([] if user is None else [user.packages]),
                    *(str(Path(p).absolute()) for p in extra_ro_binds))
        bound = tuple(p for p in SYSTEM_PATHS if os.path.isdir(p) and not os.path.islink(p)) + ro_binds
        hidden = (*task_data_dirs(bound), *(str(Path(p).absolute()) for p in hidden_paths))
        self._mount_args = (
            *_namespace_args(limits.network), *system_mount_args(),
            "--size", str(tmp_bytes), "--tmpfs", "/tmp", "--proc", "/proc", *proc_cover_args(), "--dev", "/dev",
            "--size", str(tmp_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
            *(arg for path in ro_binds for arg in ("--ro-bind", path, path)), *hidden_mount_args(hidden, bound),
            "--bind", str(self.workspace), self.workdir, "--remount-ro", "/", "--chdir", self.workdir, "--clearenv",
        )  # fmt: skip
        self._cgroup_parents = _cgroup_parents(limits)
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def _argv(self, ready_fd: int, command_fd: int, env: dict[str, str] | None,
              command: bytes | None = None) -> list[str]:
        argv = [self._bwrap, *self._mount_args]
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        defaults = {"PATH": path, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", **self._user_env}
        environment = {**defaults, **(env or {})}
        for key, value in environment.items():
            argv += ["--setenv", key, value]
        limits = self.limits
        rlimits = (
            (resource.RLIMIT_CPU, limits.cpu_time_s, limits.cpu_time_s + 1),  # SIGXCPU first, SIGKILL a second later
            (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
            (resource.RLIMIT_NPROC, limits.max_processes + _REAPER_TASKS, limits.max_processes + _REAPER_TASKS),
            (resource.RLIMIT_FSIZE, limits.max_file_bytes, limits.max_file_bytes),
            (resource.RLIMIT_CORE, 0, 0),
        )
        return [*argv, "--", *launcher_argv(ready_fd, command_fd, rlimits, command, environment)]

    def run(
        self, command: str, *, timeout_s: float | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ConfigurationError(f"timeout_s={timeout_s!r} must be positive")
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} no longer exists")
        data = command.encode("utf-8", "surrogatepass")  # a lone surrogate (JSON "\\ud800") is the command's own
        if len(data) > self.limits.max_command_bytes:
            return self._refuse_long(command, len(data))
        with contextlib.ExitStack() as cleanup:
            prefix: list[str] = []
            cgroup = None
            if self._cgroup_parents is not None:
                cgroup = CommandCgroup(self._cgroup_parents, self.limits.max_processes + _BWRAP_TASKS,
                                       self.limits.tree_memory_bytes)  # fmt: skip
                cleanup.callback(cgroup.remove)
                prefix = cgroup.join_prefix()
            command_fd = command_memfd(data)
            cleanup.callback(os.close, command_fd)
            ready_read, ready_write = os.pipe()
            cleanup.callback(os.close, ready_read)
            start = time.monotonic()
            try:
                argv = [*prefix, *self._argv(ready_write, command_fd, env, data)]
                proc = self._start(argv, (ready_write, command_fd), stdin is not None)
            finally:
                os.close(ready_write)  # bwrap holds its copy; ours must go so the handshake pipe can reach EOF
            if stdin is not None:
                threading.Thread(target=feed, args=(proc.stdin, stdin), daemon=True).start()
            result = self._collect(proc, command, timeout, ready_read, start)
            return result if cgroup is None else self._note_oom(result, cgroup.oom_kills())

    def _refuse_long(self, command: str, size: int) -> CommandResult:
        """A command over `max_command_bytes` is the agent's failure: an answer it sees, nothing run."""
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
        limit = self.limits.max_command_bytes
        message = (f"sandbox: the command is {size} bytes, more than the {limit} bytes allowed "
                   "(SandboxLimits.max_command_bytes); it was not run. Write long content to a file in smaller "
                   "pieces.\n")  # fmt: skip
        return CommandResult(command=command, exit_code=_TOO_LONG_EXIT, stdout="", stderr=message, duration_s=0.0)

    def _note_oom(self, result: CommandResult, kills: int) -> CommandResult:
        if not kills:
            return result
        note = (f"\n[sandbox: the command used more than {self.limits.tree_memory_bytes} bytes of memory in total "
                "(its processes, /tmp, /dev/shm and files written to memory-backed storage; "
                f"SandboxLimits.tree_memory_bytes): the kernel killed {kills} process(es) with SIGKILL]\n")
        return dataclasses.replace(result, stderr=result.stderr + note, oom_kills=kills)

    def _start(self, argv: list[str], fds: tuple[int, ...], with_stdin: bool) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            try:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"}, cwd="/", pass_fds=fds,
                    start_new_session=True,
                )  # fmt: skip
            except OSError as error:
                raise SandboxError(f"cannot start bubblewrap: {error}") from error
            self._running.add(proc)
        return proc

    def _collect(
        self, proc: subprocess.Popen[bytes], command: str, timeout: float, ready_read: int, start: float
    ) -> CommandResult:
        captures = (BoundedCapture(self.limits.output_bytes), BoundedCapture(self.limits.output_bytes))
        streams = (proc.stdout, proc.stderr)
        readers = [threading.Thread(target=drain, args=pair, daemon=True)
                   for pair in zip(streams, captures, strict=True)]
        for reader in readers:
            reader.start()
        timed_out = False
        try:
            timed_out = not wait_for_exit(proc, timeout)
        finally:
            if proc.returncode is None:  # timed out, or interrupted (KeyboardInterrupt): kill the whole tree
                kill_group(proc)
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
        if not was_started(ready_read):
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
            kill_group(proc)
            proc.wait()

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
