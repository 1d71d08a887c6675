"""The launcher every sandbox backend runs a command through: rlimits, the command from a memfd, then /bin/sh.

Two implementations of the same steps. A command that fits one argv string and has no NUL byte, where
`/usr/bin/prlimit` (util-linux) and `/bin/bash` exist, runs through `prlimit` and a bash one-liner (`SHELL_LAUNCHER`,
`shell_launcher_argv`): no Python interpreter starts, which took ~11 ms of machine CPU of each ~19 ms sandboxed call
on the benchmark host (tool calls compete for the cores with the learner beside them). Any other command, or a host
without those two, runs through the Python launcher below (`launcher_argv`), which also handles the long and NUL
cases. What the command sees is the same: its limits, its /bin/sh, SIGPIPE at its default action, free stdin.

    fd = command_memfd(command.encode("utf-8", "surrogatepass"))
    argv = launcher_argv(ready_fd, fd, ((resource.RLIMIT_CPU, 60, 61), ...))   # what the backend execs last
    subprocess.Popen([*backend_prefix, *argv], pass_fds=(ready_fd, fd), start_new_session=True, ...)

It runs as `sys.executable -I -S -c LAUNCHER READY_FD COMMAND_FD [RESOURCE SOFT HARD]...`, a launcher instead of
`preexec_fn` (unsafe in threads) and one for every backend (bubblewrap runs it inside the sandbox, the local
fallback on the host), so both apply limits and read commands the same way. In order:

0. SIGPIPE back to its default action: Python ignores it at startup, and an ignored signal stays ignored across
   exec, so without this every command would run with SIGPIPE ignored. A writer into a closed pipe (`cat f | head
   -x`) would then print "Broken pipe" or not depending on which process ran first, and what the model sees next
   would depend on the scheduler. With the default, as in a terminal's shell, the writer ends silently;
1. each rlimit (a `resource.RLIMIT_*` number, soft, hard), each value capped at the ceiling the process already has;
2. with READY_FD >= 0, one byte written to it: proof the backend's own setup succeeded, so a backend failure is never
   mistaken for the command exiting 1 (what follows, reading the command included, is the command's own: an OOM kill
   there is its result); -1: no handshake;
3. the command, read from the memfd COMMAND_FD rather than argv, so its length is no argv limit: one that fits one
   argument (128 KiB, MAX_ARG_STRLEN) and has no NUL runs as `/bin/sh -c COMMAND`; a longer one is read by the shell
   from the memfd, moved to fd 3 and closed before the command runs (its errors then read "eval: ..."). Standard
   input stays free for the caller's `stdin`.
"""

from __future__ import annotations

import functools
import os
import resource
import subprocess
import sys
from collections.abc import Mapping, Sequence

from ..errors import SandboxError

Rlimit = tuple[int, int, int]  # (resource.RLIMIT_* number, soft limit, hard limit)

LAUNCHER = """\
import errno, os, resource as r, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
ready, source, *limits = map(int, sys.argv[1:])
for kind, soft, hard in zip(limits[0::3], limits[1::3], limits[2::3]):
    ceiling = r.getrlimit(kind)[1]
    r.setrlimit(kind, tuple(v if ceiling == r.RLIM_INFINITY else min(v, ceiling) for v in (soft, hard)))
if ready >= 0:
    os.write(ready, b"1")
    os.close(ready)
size, command = os.fstat(source).st_size, b""
while len(command) < size:
    command += os.pread(source, size - len(command), len(command))
os.set_inheritable(source, False)
if b"\\0" not in command:
    try:
        os.execv("/bin/sh", [b"/bin/sh", b"-c", command])
    except OSError as error:
        if error.errno != errno.E2BIG:
            raise
if source == 3:
    os.set_inheritable(3, True)
else:
    os.dup2(source, 3)
    os.close(source)
os.execv("/bin/sh", ["/bin/sh", "-c", 'c=$(cat <&3); exec 3<&-; eval "unset c; $c"'])
"""


def launcher_argv(ready_fd: int, command_fd: int, rlimits: Sequence[Rlimit],
                  command: bytes | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """The argv that runs the launcher: the shell launcher where `command` (the memfd's bytes) can take it
    (`shell_launcher_argv`; `env` the environment the command gets), else this interpreter (isolated, no site)
    running `LAUNCHER`; see the module docstring."""
    if command is not None:
        fast = shell_launcher_argv(ready_fd, command_fd, rlimits, command, "SHLVL" in (env or {}))
        if fast is not None:
            return fast
    numbers = (ready_fd, command_fd, *(value for rlimit in rlimits for value in rlimit))
    return [sys.executable, "-I", "-S", "-c", LAUNCHER, *map(str, numbers)]


# The Python launcher's steps, in bash (`bash -p`: no BASH_ENV, ENV, SHELLOPTS or exported functions read from the
# caller's environment), after `prlimit` set the limits: the handshake byte, the command read whole from the memfd
# (`read -d ''` keeps every byte but NUL; `shell_launcher_argv` sends no command with one), both fds closed, then the
# command as `/bin/sh -c COMMAND`, with what the Python launcher leaves: SIGPIPE at its default action (no Python
# runs, so the default the backends' `Popen` restored stays), SIGXFSZ ignored (Python ignores it at startup: a write
# past RLIMIT_FSIZE fails with EFBIG instead of killing the writer), and the caller's SHLVL (bash's exec restores a
# caller's value; where the caller set none, $3 = 0, it would export SHLVL=0, so `env -u` takes it out).
SHELL_LAUNCHER = """\
ready=$1 source=$2
if [ "$ready" -ge 0 ]; then printf 1 >&"$ready" || exit 125; exec {ready}>&-; fi
IFS= read -r -d '' command <&"$source"
exec {source}<&-
trap '' XFSZ
if [ "$3" = 1 ]; then exec /bin/sh -c "$command"; fi
exec /usr/bin/env -u SHLVL /bin/sh -c "$command"
"""
PRLIMIT, BASH = "/usr/bin/prlimit", "/bin/bash"
MAX_ARG_STRLEN = 128 << 10  # Linux's limit on one argv string, its terminating NUL included
_PRLIMIT_OPTIONS = {resource.RLIMIT_CPU: "--cpu", resource.RLIMIT_AS: "--as", resource.RLIMIT_NPROC: "--nproc",
                    resource.RLIMIT_FSIZE: "--fsize", resource.RLIMIT_CORE: "--core"}


@functools.cache
def shell_launcher_available() -> bool:
    """`prlimit`, a bash with `{var}>&-` (bash >= 4.1) and an `env -u` on this host: `SHELL_LAUNCHER`'s steps, run
    once (both backends bind /usr and /bin, so the sandbox sees the same programs)."""
    if not (os.access(PRLIMIT, os.X_OK) and os.access(BASH, os.X_OK)):
        return False
    steps = "exec {f}</dev/null; exec {f}<&-; exec /usr/bin/env -u SHLVL /bin/sh -c :"
    try:
        probe = subprocess.run([PRLIMIT, "--core=0:0", "--", BASH, "-p", "-c", steps],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def _capped(kind: int, value: int) -> str:
    """`value` capped at this process's hard limit of `kind` (what the sandbox inherits), in prlimit's notation."""
    ceiling = resource.getrlimit(kind)[1]
    value = value if ceiling == resource.RLIM_INFINITY else min(value, ceiling)
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def shell_launcher_argv(ready_fd: int, command_fd: int, rlimits: Sequence[Rlimit], command: bytes,
                        keep_shlvl: bool = False) -> list[str] | None:
    """`prlimit --RESOURCE=SOFT:HARD ... -- bash -p -c SHELL_LAUNCHER launcher READY_FD COMMAND_FD KEEP_SHLVL`, each
    limit capped at the ceiling as the Python launcher caps it (`keep_shlvl`: the command's environment sets SHLVL);
    None where the Python launcher must run: a command with a NUL byte or too long for one argv string, a limit
    prlimit does not take, or no prlimit / bash here."""
    if b"\0" in command or len(command) >= MAX_ARG_STRLEN or any(k not in _PRLIMIT_OPTIONS for k, _, _ in rlimits):
        return None
    if not shell_launcher_available():
        return None
    limits = [f"{_PRLIMIT_OPTIONS[kind]}={_capped(kind, soft)}:{_capped(kind, hard)}" for kind, soft, hard in rlimits]
    return [PRLIMIT, *limits, "--", BASH, "-p", "-c", SHELL_LAUNCHER, "launcher", str(ready_fd), str(command_fd),
            "1" if keep_shlvl else "0"]


def command_memfd(data: bytes) -> int:
    """A memfd holding the command (at offset 0), for the launcher to read; the caller closes it."""
    try:
        fd = os.memfd_create("sandbox-command")
    except OSError as error:
        raise SandboxError(f"cannot create the memfd that passes the command: {error}") from error
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException as error:
        os.close(fd)
        if isinstance(error, OSError):
            raise SandboxError(f"cannot write the command into its memfd: {error}") from error
        raise
    return fd
