"""Temporary folders that do not outlive the process that made them, however it ends.

    folder = OwnedTempDir("thundersync-serve-")    # tempfile.mkdtemp + a reaper
    shared = OwnedTempDir("thundersync-lora-", parent="/shared/adapters", mode=0o755)   # inside a given folder
    ... folder.path ...
    folder.close()                                  # removes it now

The embedded servers' policy folder and the published weights are hundreds of MB for a real model; a run stopped by
SIGTERM (a scheduler, `kill`, `timeout`) must not leave them in the temp dir, and neither Python's `atexit` nor
`weakref.finalize` runs on SIGTERM or SIGKILL. So each folder gets a reaper: a tiny `sh` child in its own session,
ignoring SIGINT/SIGTERM/SIGHUP, blocked reading a pipe whose write end only this process holds. When this process
ends — normal exit, exception, Ctrl-C, SIGTERM, even SIGKILL — the kernel closes that end, the read sees EOF, and the
reaper removes the folder. No signal handler is installed in the caller's process.

What can still leave a folder behind: killing the reaper too (a SIGKILL sent to every process of a cgroup, the OOM
killer, a power cut). A child forked without exec (fork-started multiprocessing, DataLoader workers) shares the
write end, so the folder then goes when the last of them exits.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

# $0 is the folder. `read` returns non-zero at EOF: once no process holds the pipe's write end any more.
_REAPER = 'trap "" INT TERM HUP; while read -r _; do :; done; exec rm -rf -- "$0"'


class OwnedTempDir:
    """A `tempfile.mkdtemp(prefix=..., dir=parent)` folder removed by `close()` or, at the latest, when this process
    ends. `mode`: its permissions (mkdtemp makes it 0o700, which a server running as another user cannot read)."""

    def __init__(self, prefix: str, *, parent: str | Path | None = None, mode: int | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=None if parent is None else str(parent)))
        try:
            if mode is not None:
                self.path.chmod(mode)
            self._reaper: subprocess.Popen | None = subprocess.Popen(
                ["sh", "-c", _REAPER, str(self.path)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)  # own session: a Ctrl-C of the job spares it
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def close(self) -> None:
        """Remove the folder now; idempotent. The reaper then finds nothing to remove and exits."""
        shutil.rmtree(self.path, ignore_errors=True)
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.stdin is not None:
            reaper.stdin.close()
            try:
                reaper.wait(timeout=5.0)  # it exits at once: nothing left to remove
            except subprocess.TimeoutExpired:
                pass  # a forked child still holds the pipe; the reaper exits with it, and the folder is gone already
