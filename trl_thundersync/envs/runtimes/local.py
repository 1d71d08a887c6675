"""UNSANDBOXED test/dev fallback: runs commands as plain host subprocesses in the workspace directory.

It implements the `Sandbox` protocol (timeouts kill the process group, rlimits, bounded output) but gives NO
isolation: commands see the whole host file system and the network, and paths are host paths (`workdir` is the
workspace itself, not /workspace). Use it only for tests and on machines without bubblewrap; production code uses
`trl_thundersync.envs.runtimes.make_sandbox`.

Commands go through the same launcher as bubblewrap's (`launcher.py`: rlimits, the command from a memfd) without
its handshake, and their output through the same head-and-tail capture (`process_io.BoundedCapture`), read from
temporary files: a background child left behind cannot hold a pipe open. Limits set: RLIMIT_CPU, RLIMIT_AS and
RLIMIT_FSIZE (not RLIMIT_NPROC: on the host it would count every process of the caller's uid).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import SandboxError
from .api import CommandResult, SandboxLimits
from .launcher import command_memfd, launcher_argv
from .process_io import BoundedCapture, kill_group, wait_for_exit


class LocalSubprocessSandbox:
    """Subprocess stand-in for a real sandbox (see the module docstring: no isolation)."""

    def __init__(self, workspace: str | Path, limits: SandboxLimits = SandboxLimits()) -> None:
        self.workspace = Path(workspace)
        self.workdir = str(self.workspace)
        self.limits = limits
        self._closed = False
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} does not exist")

    def run(
        self, command: str, *, timeout_s: float | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        if self._closed:
            raise SandboxError("sandbox is closed")
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} is gone")
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        start = time.perf_counter()
        data = command.encode("utf-8", "surrogatepass")
        command_fd = command_memfd(data)
        try:
            with tempfile.TemporaryFile() as inp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                inp.write(stdin or b"")
                inp.seek(0)
                environment = self._env(env)
                proc = subprocess.Popen(self._argv(command_fd, data, environment), cwd=self.workspace, stdin=inp,
                                        stdout=out, stderr=err, env=environment, pass_fds=(command_fd,),
                                        start_new_session=True)
                timed_out = not wait_for_exit(proc, timeout)
                kill_group(proc, after_exit=True)  # also ends background children left behind by a finished command
                proc.wait()
                captures = (BoundedCapture(self.limits.output_bytes), BoundedCapture(self.limits.output_bytes))
                for capture, stream in zip(captures, (out, err), strict=True):
                    capture.feed_file(stream)
        finally:
            os.close(command_fd)
        code = proc.returncode
        return CommandResult(
            command=command, exit_code=None if (timed_out or code < 0) else code, stdout=captures[0].text(),
            stderr=captures[1].text(), duration_s=time.perf_counter() - start, timed_out=timed_out,
            truncated_bytes=captures[0].elided + captures[1].elided, signal=-code if code < 0 else None,
        )

    def close(self) -> None:
        self._closed = True

    def _argv(self, command_fd: int, command: bytes | None = None, env: dict[str, str] | None = None) -> list[str]:
        limits = self.limits
        rlimits = (
            (resource.RLIMIT_CPU, limits.cpu_time_s, limits.cpu_time_s),
            (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
            (resource.RLIMIT_FSIZE, limits.max_file_bytes, limits.max_file_bytes),
        )
        return launcher_argv(-1, command_fd, rlimits, command, env)

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        path = os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
        env = {"PATH": path, "HOME": str(self.workspace), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(extra or {})
        return env
