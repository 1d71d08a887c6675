"""The launcher every sandbox backend runs a command through: rlimits, the command from a memfd, then /bin/sh.

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

import os
import sys
from collections.abc import Sequence

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


def launcher_argv(ready_fd: int, command_fd: int, rlimits: Sequence[Rlimit]) -> list[str]:
    """The argv that runs the launcher with this interpreter (isolated, no site): see the module docstring."""
    numbers = (ready_fd, command_fd, *(value for rlimit in rlimits for value in rlimit))
    return [sys.executable, "-I", "-S", "-c", LAUNCHER, *map(str, numbers)]


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
