"""UNSANDBOXED test/dev fallback: runs commands as plain host subprocesses in the workspace directory.

It implements the `Sandbox` protocol (timeouts kill the process group, rlimits, bounded output) but gives NO
isolation: commands see the whole host file system and the network, and paths are host paths (`workdir` is the
workspace itself, not /workspace). Use it only for tests and on machines without bubblewrap; production code uses
`trl_thundersync.envs.sandbox.make_sandbox`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..sandbox_api import CommandResult, SandboxError, SandboxLimits

# Sets the rlimits, then becomes /bin/sh -c COMMAND (a launcher instead of preexec_fn, which is unsafe in threads).
_LAUNCHER = """\
import os, resource as r, sys
cpu, mem, fsize, command = sys.argv[1:]
for kind, value in ((r.RLIMIT_CPU, int(cpu)), (r.RLIMIT_AS, int(mem)), (r.RLIMIT_FSIZE, int(fsize))):
    r.setrlimit(kind, (value, value))
os.execv("/bin/sh", ["/bin/sh", "-c", command])
"""


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
        with tempfile.TemporaryFile() as inp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            inp.write(stdin or b"")
            inp.seek(0)
            limits = self.limits
            argv = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(limits.cpu_time_s), str(limits.memory_bytes),
                    str(limits.max_file_bytes), command]
            proc = subprocess.Popen(argv, cwd=self.workspace, stdin=inp, stdout=out, stderr=err,
                                    env=self._env(env), start_new_session=True)
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            self._kill_group(proc.pid)  # also reaps background children left behind by a finished command
            proc.wait()
            stdout, cut_out = self._bounded(out)
            stderr, cut_err = self._bounded(err)
        code = proc.returncode
        return CommandResult(
            command=command, exit_code=None if (timed_out or code < 0) else code, stdout=stdout, stderr=stderr,
            duration_s=time.perf_counter() - start, timed_out=timed_out, truncated_bytes=cut_out + cut_err,
            signal=-code if code < 0 else None,
        )

    def close(self) -> None:
        self._closed = True

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        path = os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])
        env = {"PATH": path, "HOME": str(self.workspace), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(extra or {})
        return env

    @staticmethod
    def _kill_group(pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _bounded(self, stream) -> tuple[str, int]:
        keep = self.limits.output_bytes
        size = stream.seek(0, os.SEEK_END)
        stream.seek(0)
        if size <= keep:
            return stream.read().decode("utf-8", errors="replace"), 0
        head = stream.read(keep // 2)
        stream.seek(size - keep // 2)
        tail = stream.read()
        cut = size - len(head) - len(tail)
        return (head + f"\n[... {cut} bytes elided ...]\n".encode() + tail).decode("utf-8", errors="replace"), cut
