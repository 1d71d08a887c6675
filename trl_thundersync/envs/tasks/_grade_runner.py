"""The grading runner: runs pytest inside a grading sandbox and reports each test's outcome over a private channel.

The package never imports this file. `pytest_channel.py` (on the host) reads it as text and feeds it to
`python3 -I -c BOOTSTRAP` on the sandbox command's stdin, followed by a NUL byte and a JSON payload:

    {"key": hex, "args": [pytest arguments], "files": {name: text}, "hide_files": bool, "cwd_on_path": bool,
     "site_dirs": [directories]}

It is self-contained (standard library and pytest only) because inside a sandbox the package is not importable
and its files are hidden. In order, before any code under test can run:

1. stdin has already been read to its end by the bootstrap (the key is in no file, argv or environment
   variable), and is replaced by /dev/null;
2. the channel is a private duplicate of the sandbox's stdout (close-on-exec, so no child inherits it); fd 1 then
   points at stderr, so everything else — pytest's console, the tests, the code under test, their children —
   writes to stderr, which the host only shows to humans;
3. prctl(PR_SET_DUMPABLE, 0): child processes (same uid) can no longer open this process's /proc/PID/{mem,fd,
   environ,...} or ptrace it, so they cannot read the key, the channel fd or a hidden verifier from memory;
4. `files` are written into a fresh private directory under the sandbox's /tmp (their path replaces "{files}" in
   the arguments); with `hide_files` they are unlinked as soon as collection finishes, before any test runs;
5. `site_dirs` (the host's user site, `pip install --user`, which `-I` leaves out; bound read-only by the sandbox)
   are added with their .pth files, where the site module puts a user site: before the prefix's site-packages;
6. pytest is imported with that sys.path (the workspace is not on it yet, so no file there can shadow pytest or the
   standard library modules it imports), then the working directory is prepended when `cwd_on_path` (what
   `python -m pytest` does).

Channel records, one `os.write` each (atomic below PIPE_BUF), each starting with a newline so that bytes anyone
else wrote to the same pipe can never join a record: `\\n<seq> <kind> <json> <mac>\\n`, where seq counts records
from 0 and mac is HMAC-SHA256(key, "<seq> <kind> <json>"). Kinds: `collected` (a node id), `outcome` ([node id,
outcome]), `done` (pytest's exit status, written after `pytest.main` returns) and `fatal` (the runner itself
failed). A MAC and not a bare secret prefix, because the pipe is not private: the sandbox's pid 1 (bwrap) holds its
write end, and any process in the sandbox can reopen it through /proc/1/fd/1 — for writing, and for reading, which
takes records away from the host. A record read that way shows its MAC but never the key, so nothing can be forged
from it; the sequence number makes a taken, replayed or reordered record end what the host accepts (it can only
lose outcomes, never add one). After `done` the process ends with os._exit: no atexit handler of the code under
test runs.
"""

import hashlib
import hmac
import json
import os
import sys

PR_SET_DUMPABLE = 4  # <linux/prctl.h>
PIPE_BUF = 4096  # a pipe write of at most this many bytes is atomic


class ChannelReporter:
    """A pytest plugin object: folds setup/call/teardown reports into one outcome per node id and emits it."""

    def __init__(self, channel_fd, key, hidden):
        self._fd = channel_fd
        self._key = key
        self._seq = 0
        self.hidden = hidden  # paths to unlink once collection is over
        self._outcomes = {}

    def emit(self, kind, value):
        body = f"{self._seq} {kind} {json.dumps(value)}"
        self._seq += 1
        mac = hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()
        data = f"\n{body} {mac}\n".encode()
        while data:
            data = data[os.write(self._fd, data[:PIPE_BUF]):]

    def unlink_hidden(self):
        for path in self.hidden:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def pytest_collection_finish(self, session):
        self.unlink_hidden()
        for item in session.items:
            self.emit("collected", item.nodeid)

    def pytest_runtest_logreport(self, report):
        outcome = fold(self._outcomes.get(report.nodeid), report.when, report.outcome, hasattr(report, "wasxfail"))
        self._outcomes[report.nodeid] = outcome
        if report.when == "teardown" and outcome is not None:
            self.emit("outcome", [report.nodeid, outcome])


def fold(previous, when, outcome, wasxfail):
    """One test's outcome after its `when` report, as pytest's summary names it (None: not decided yet).

    setup failed -> ERROR, setup skipped -> SKIPPED (XFAIL for xfail(run=False)); call passed -> PASSED (XPASS when
    an xfail test passed non-strictly), failed -> FAILED (also a strict XPASS), skipped -> SKIPPED (XFAIL when it
    failed as expected); a failing teardown makes a test that had not failed an ERROR.
    """
    if when == "setup":
        if outcome == "failed":
            return "ERROR"
        if outcome == "skipped":
            return "XFAIL" if wasxfail else "SKIPPED"
        return None
    if when == "call":
        if outcome == "passed":
            return "XPASS" if wasxfail else "PASSED"
        if outcome == "failed":
            return "FAILED"
        return "XFAIL" if wasxfail else "SKIPPED"
    if outcome == "failed" and previous not in ("FAILED", "ERROR"):
        return "ERROR"
    return previous


def _private_channel():
    """A close-on-exec duplicate of stdout for the records; fd 1 becomes stderr and fd 0 /dev/null."""
    channel = os.dup(1)  # os.dup's result is not inheritable
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return channel


def _not_dumpable():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _write_files(files):
    """Write `files` into a fresh private directory of /tmp; (directory, paths). No files: no directory."""
    if not files:
        return None, []
    import tempfile

    directory = tempfile.mkdtemp(prefix="grade-")
    paths = []
    for name, text in files.items():
        path = os.path.join(directory, name)
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(text)
        paths.append(path)
    return directory, paths


def _add_site_dirs(directories):
    """Add `directories` as the site module adds a user site: .pth files processed, ahead of site-packages."""
    if not directories:
        return
    import site

    before = list(sys.path)
    for directory in directories:
        site.addsitedir(directory)
    added = [path for path in sys.path if path not in before]
    prefix_sites = set(site.getsitepackages())
    at = next((i for i, path in enumerate(before) if path in prefix_sites), len(before))
    sys.path[:] = before[:at] + added + before[at:]


def main(payload):
    spec = json.loads(payload)
    channel = _private_channel()
    reporter = ChannelReporter(channel, bytes.fromhex(spec.pop("key")), [])
    try:
        _not_dumpable()
        sys.dont_write_bytecode = True  # no __pycache__ next to a hidden verifier or in the graded copy
        directory, paths = _write_files(spec["files"])
        if spec["hide_files"]:
            reporter.hidden = paths
        args = [arg.replace("{files}", directory) if directory else arg for arg in spec["args"]]
        _add_site_dirs(spec["site_dirs"])
        import pytest
    except Exception as error:  # the runner could not start pytest: the harness is broken, say so on the channel
        reporter.emit("fatal", f"{type(error).__name__}: {error}")
        os._exit(3)
    if spec["cwd_on_path"]:
        sys.path.insert(0, os.getcwd())
    try:
        status = int(pytest.main(args, plugins=[reporter]))
    finally:
        reporter.unlink_hidden()
    reporter.emit("done", status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__thundersync_grade__":
    main(globals().pop("PAYLOAD"))  # put in this namespace by the bootstrap; not left there
