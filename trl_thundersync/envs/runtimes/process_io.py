"""Process I/O of one sandboxed command: bounded output capture, stdin feeding, waiting and killing.

Shared by the backends (`bwrap.BwrapSandbox` reads its pipes with `drain`, `local.LocalSubprocessSandbox` its output
files with `BoundedCapture.feed_file`); nothing here knows about a backend beyond "kill the process group".
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

    def feed_file(self, stream: BinaryIO) -> None:
        """Take a whole output file, reading only the bytes kept (its head, then its end) and counting the rest."""
        size = stream.seek(0, os.SEEK_END)
        stream.seek(0)
        self.feed(stream.read(self._head_cap))
        start = max(stream.tell(), size - self._tail_cap)
        self.total += start - stream.tell()  # passed over unread: they fall between head and tail
        stream.seek(start)
        self.feed(stream.read())

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


def kill_group(proc: subprocess.Popen[bytes], *, after_exit: bool = False) -> None:
    """SIGKILL the process group `proc` leads (started with `start_new_session=True`) while `proc` runs: for bwrap,
    `--die-with-parent` then takes down the sandbox's pid namespace. `after_exit=True` kills the group also once `proc`
    has exited, to end background children it left (the local backend has no pid namespace to end them)."""
    if after_exit or proc.poll() is None:
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
