"""Process I/O of one sandboxed command: bounded output capture, stdin feeding, waiting and killing.

Used by `sandbox.BwrapSandbox`; nothing here knows about bubblewrap beyond "kill the process group".
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from typing import BinaryIO

_READ_CHUNK = 1 << 16


class BoundedCapture:
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


def feed(stream: BinaryIO, data: bytes) -> None:
    """Write a command's stdin, then close it; a command that exits without reading it is not an error."""
    with contextlib.suppress(BrokenPipeError, OSError):
        with stream:
            stream.write(data)


def drain(stream: BinaryIO, capture: BoundedCapture) -> None:
    try:
        while chunk := os.read(stream.fileno(), _READ_CHUNK):
            capture.feed(chunk)
    except OSError as error:
        capture.error = error


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL bwrap's process group; `--die-with-parent` then takes down the sandbox's pid namespace."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # exited between poll() and killpg()
            os.killpg(proc.pid, signal.SIGKILL)


def was_started(ready_read: int) -> bool:
    os.set_blocking(ready_read, False)
    try:
        return os.read(ready_read, 1) == b"1"
    except BlockingIOError:
        return False


def wait_for_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
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
