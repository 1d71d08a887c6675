"""A guard process that ties a `vllm serve` to the trainer that started it: when the trainer is gone — closed,
crashed, or SIGKILLed — the server and its engine-core processes are stopped too.

    python -m trl_thundersync.rollout.vllm_guard --parent PID -- /venv/bin/python -m vllm.entrypoints... ARGS

vLLM has no "exit with parent" option (the embedded servers do: `--exit-with-parent`), and its API server starts its
engine core as a separate process that outlives a SIGKILLed API server. So the trainer starts this guard (stdlib
only, the trainer's own interpreter) as the leader of a new process group, and the guard starts vLLM inside that
group. The guard then waits for one of three things:

- vLLM exits: the guard stops what is left of the group and exits with vLLM's exit code (negative codes, a signal,
  become 128 + signal, as a shell reports them), so the trainer sees how the server ended;
- the trainer is gone (this process's parent changed: it was re-parented to init or a subreaper): the group is
  stopped;
- SIGTERM or SIGINT from the trainer (`VLLMServerProcess.stop`): the group is stopped.

"Stopped" is SIGTERM to vLLM's whole group, then SIGKILL to what is left of it after `--grace` seconds. A terminal's
Ctrl-C does not reach the group (it has its own session): the trainer decides what a Ctrl-C means, then closes its
engine, which stops the server.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

_POLL_S = 0.25


def _group_members() -> list[int]:
    """Pids of the other processes in this process's group (Linux /proc; empty where it cannot be read)."""
    group, me, members = os.getpgrp(), os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == group:
            members.append(int(entry))
    return members


def _stop_group(child: subprocess.Popen, grace: float) -> None:
    """SIGTERM to every process of this group but the guard (which ignores it), SIGKILL to those still there after
    `grace` seconds."""
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        child.poll()  # reap the API server so it does not linger as a zombie group member
        if not _group_members():
            return
        time.sleep(_POLL_S)
    for pid in _group_members():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    child.poll()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent", type=int, required=True, help="pid of the trainer; the server stops with it")
    parser.add_argument("--grace", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server's argv")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no server command after --")
    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)  # same group: _stop_group reaches its children
    while True:
        code = child.poll()
        if code is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _stop_group(child, args.grace)  # the engine core of an API server that died
            return 128 - code if code < 0 else code
        if stop_requested or os.getppid() != args.parent:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _stop_group(child, args.grace)
            return 0
        time.sleep(_POLL_S)


if __name__ == "__main__":
    sys.exit(main())
