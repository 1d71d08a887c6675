"""Host side of the grading channel: run pytest in a grading sandbox and take outcomes only from the runner's records.

A grade must never come from text the code under test can print. So the grader does not parse pytest's console
output (which the tested code shares): `run_pytest` feeds `_grade_runner.py` (our pytest plugin and launcher) to
`python3 -I` on the sandbox command's stdin together with a fresh random key, and the runner writes one record per
collected test, per test outcome and at the end (`done`) to a private duplicate of the sandbox's stdout, each
numbered and authenticated with HMAC-SHA256 under that key. Everything else the run prints goes to stderr and is
kept only as a log for humans. `read_records` accepts only authentic records, in sequence, up to `done`.

What this closes, and what it does not: code under test that prints, and child processes that write to (or read
from) any pipe, file or log they can find, cannot forge an outcome: they do not have the key (the runner read it
from stdin before any of them ran, and made its process non-dumpable, so same-uid children cannot read its memory or
fds through /proc), and a record they take off the pipe shows only its MAC. Taking records away can only lose
outcomes, which fails the attempt (or, for a terminal task, the checks it hid). Code that runs *inside* pytest's
interpreter (the SWE module under test, imported by the tests) still can forge: it can find the key in the
interpreter's memory and write records, patch pytest's hooks, or rewrite a test module as it is imported. Closing
that needs the tests to run in a process the code under test does not share.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TaskFormatError
from ..runtimes.api import Sandbox
from ..runtimes.mounts import user_site
from .grading import PYTEST_TESTS_RAN

OUTCOMES = frozenset({"PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"})  # what the runner reports

# Reads the runner and its payload from stdin (separated by a NUL byte, which Python source cannot contain) and
# runs it; the key is in the payload, so it is never in argv, the environment or a file, and (read inside a
# function) it is not left in a global of `__main__` either.
_BOOTSTRAP = (
    "import sys\n"
    "def _run():\n"
    "    source, _, payload = sys.stdin.buffer.read().partition(b'\\0')\n"
    "    code = compile(source, '<thundersync-grade-runner>', 'exec')\n"
    "    exec(code, {'__name__': '__thundersync_grade__', 'PAYLOAD': payload})\n"
    "_run()\n"
)
_PYTHONS = frozenset({"python", "python3"})
_SHELL_OPERATORS = frozenset({";", "&&", "||", "|", "&", ">", ">>", "<", "2>", "2>&1", "(", ")"})


@dataclass(frozen=True)
class PytestRun:
    """What one grading pytest run reported over the channel (never parsed from its console output)."""

    outcomes: Mapping[str, str] = field(default_factory=dict)  # node id -> PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS
    collected: tuple[str, ...] = ()  # node ids pytest collected, in order
    exit_status: int | None = None  # pytest's exit status from the `done` record; None: the run never got there
    fatal: str | None = None  # the runner failed before pytest started (a broken harness, never the attempt)
    timed_out: bool = False  # the sandbox killed the run at its time limit
    log: str = ""  # pytest's console output (stderr), for humans only

    @property
    def completed(self) -> bool:
        """pytest ran to its end and ran the tests (exit status 0 or 1), as the runner itself reported."""
        return self.fatal is None and self.exit_status in PYTEST_TESTS_RAN

    def end_problem(self, what: str) -> str | None:
        """Why the run of `what` ("the tests", "the verifier") did not end normally, or None when pytest ran its tests
        to the end (exit 0 or 1); which outcomes are missing is for the caller to check."""
        if self.fatal is not None:
            return f"the grading runner failed ({self.fatal})"
        if self.timed_out and self.exit_status is None:
            return f"{what} timed out"
        if self.exit_status is None:
            return f"{what} ended before pytest finished (its process exited or was killed)"
        if not self.completed:
            return f"pytest could not run {what} (exit {self.exit_status}: collection, internal or usage error)"
        return None


def run_pytest(
    sandbox: Sandbox,
    args: tuple[str, ...],
    *,
    timeout_s: float,
    files: Mapping[str, str] | None = None,
    hide_files: bool = False,
    cwd_on_path: bool = False,
    python: str = "python3",
) -> PytestRun:
    """Run pytest with `args` in `sandbox`'s workspace through the grading runner; outcomes from the channel only.

    `files` (name -> text) are written by the runner into a private directory of the sandbox's /tmp, whose path
    replaces "{files}" in `args`; with `hide_files` they are deleted once collection finishes, before any test runs.
    `cwd_on_path` puts the workspace on sys.path after pytest is imported, as `python -m pytest` would.
    """
    key = secrets.token_bytes(32)
    user = user_site()  # `python3 -I` skips it; the runner adds it when pytest or the package lives there
    payload = {"key": key.hex(), "args": list(args), "files": dict(files or {}), "hide_files": hide_files,
               "cwd_on_path": cwd_on_path, "site_dirs": [] if user is None else [user.packages]}
    stdin = _runner_source() + b"\0" + json.dumps(payload).encode()
    command = f"exec {shlex.quote(python)} -I -c {shlex.quote(_BOOTSTRAP)}"
    result = sandbox.run(command, timeout_s=timeout_s, env={"PYTHONDONTWRITEBYTECODE": "1"}, stdin=stdin)
    run = read_records(result.stdout, key)
    return PytestRun(outcomes=run.outcomes, collected=run.collected, exit_status=run.exit_status, fatal=run.fatal,
                     timed_out=result.timed_out, log=result.stderr)


def record_mac(key: bytes, body: str) -> str:
    """The MAC closing a channel record `<seq> <kind> <json>` (the runner computes the same)."""
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def read_records(text: str, key: bytes) -> PytestRun:
    """The authentic records in `text`, in sequence from 0, up to `done`.

    A line whose MAC does not match is not a record (forged, or cut short by elision); a record numbered below the
    next expected one is a replayed copy and ignored; one numbered above means a record is missing (taken off the
    pipe by another process, or elided), so nothing after it is accepted.
    """
    outcomes: dict[str, str] = {}
    collected: list[str] = []
    fatal = None
    expected = 0
    for line in text.split("\n"):
        body, _, mac = line.rpartition(" ")
        if not body or not hmac.compare_digest(mac.encode(), record_mac(key, body).encode()):
            continue
        seq, kind, value = _parse_body(body)
        if seq < expected:
            continue
        if seq > expected:
            break
        expected += 1
        if kind == "collected" and isinstance(value, str):
            collected.append(value)
        elif kind == "outcome" and _is_outcome(value):
            outcomes[value[0]] = value[1]
        elif kind == "fatal" and isinstance(value, str):
            fatal = value
        elif kind == "done" and isinstance(value, int) and not isinstance(value, bool):
            return PytestRun(outcomes=outcomes, collected=tuple(collected), exit_status=value, fatal=fatal)
    return PytestRun(outcomes=outcomes, collected=tuple(collected), fatal=fatal)


def _parse_body(body: str) -> tuple[int, str, object]:
    """(seq, kind, value) of an authentic record body; the runner wrote it, so it is well formed."""
    seq, kind, raw = body.split(" ", 2)
    return int(seq), kind, json.loads(raw)


def _is_outcome(value: object) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and value[1] in OUTCOMES)


def pytest_invocation(test_command: str, where: str) -> tuple[str, tuple[str, ...]]:
    """(interpreter, pytest arguments) of a task's `test_command`: `python3 -m pytest ARGS`, `python -m pytest ARGS`
    or `pytest ARGS`. Anything else (other programs, shell operators) cannot be graded through the runner."""
    try:
        words = shlex.split(test_command)
    except ValueError as exc:
        raise TaskFormatError(f"{where}: test_command {test_command!r} is not a valid command line: {exc}") from exc
    if words[:1] == ["pytest"]:
        python, args = "python3", words[1:]
    elif len(words) >= 3 and words[0] in _PYTHONS and words[1:3] == ["-m", "pytest"]:
        python, args = words[0], words[3:]
    else:
        raise TaskFormatError(f"{where}: test_command {test_command!r} must be `python3 -m pytest [ARGS]`, "
                              "`python -m pytest [ARGS]` or `pytest [ARGS]`")
    operators = _SHELL_OPERATORS.intersection(args)
    if operators:
        raise TaskFormatError(f"{where}: test_command {test_command!r} holds shell operators {sorted(operators)}; "
                              "it must be a plain pytest invocation")
    return python, tuple(args)


@functools.cache
def _runner_source() -> bytes:
    """The runner's source, read on the host (inside a sandbox the package's files are hidden)."""
    return Path(__file__).with_name("_grade_runner.py").read_bytes()
