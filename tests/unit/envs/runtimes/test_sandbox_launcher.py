"""What both sandbox backends share: the launcher (`runtimes/launcher.py`) and the bounded capture (`process_io.py`).

Bubblewrap reads a command's output from pipes (`BoundedCapture.feed`, chunk by chunk), the local fallback from
files (`BoundedCapture.feed_file`, reading only the bytes kept): both must keep the same head, tail and count. The
local backend runs commands through the same launcher as bubblewrap's, so it also runs commands longer than one
argv string and applies the rlimits the launcher is given. No bubblewrap needed; the local runs are host processes.
Run: python -m pytest tests/unit/envs/runtimes/test_sandbox_launcher.py -q
"""

from __future__ import annotations

import resource
import shutil
import tempfile
from pathlib import Path

import pytest

from trl_thundersync.envs.runtimes import launcher
from trl_thundersync.envs.runtimes.api import SandboxLimits
from trl_thundersync.envs.runtimes.launcher import LAUNCHER
from trl_thundersync.envs.runtimes.local import LocalSubprocessSandbox
from trl_thundersync.envs.runtimes.process_io import BoundedCapture


@pytest.mark.parametrize("limit", [0, 1, 7, 16, 1000])
@pytest.mark.parametrize("size", [0, 1, 8, 15, 16, 17, 999, 5000])
def test_file_and_pipe_capture_keep_the_same_head_tail_and_count(limit: int, size: int) -> None:
    data = bytes((i * 7 + 3) % 251 for i in range(size))
    piped = BoundedCapture(limit)
    for start in range(0, size, 3):  # small, uneven chunks, as pipe reads may come
        piped.feed(data[start : start + 3])
    filed = BoundedCapture(limit)
    with tempfile.TemporaryFile() as stream:
        stream.write(data)
        filed.feed_file(stream)
    assert (filed.text(), filed.elided, filed.total) == (piped.text(), piped.elided, piped.total)
    assert filed.total == size and filed.elided == max(0, size - limit)


def test_the_local_backend_elides_the_middle_of_long_output(tmp_path: Path) -> None:
    box = LocalSubprocessSandbox(tmp_path, SandboxLimits(output_bytes=100))
    result = box.run("printf 'a%.0s' $(seq 1 400); printf 'b%.0s' $(seq 1 400)")
    assert result.ok and result.truncated_bytes == 700
    assert result.stdout == "a" * 50 + "\n[... 700 bytes elided ...]\n" + "b" * 50


def test_the_local_backend_runs_a_command_longer_than_one_argv_string(tmp_path: Path) -> None:
    box = LocalSubprocessSandbox(tmp_path)
    filler = "x" * (200 << 10)  # over MAX_ARG_STRLEN (128 KiB): read by the shell from the launcher's memfd
    result = box.run(f": '{filler}'; echo done", stdin=b"kept\n")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "done\n", "")
    assert box.run("cat").stdout == "" and box.run("cat", stdin=b"in\n").stdout == "in\n"


def test_the_local_backend_applies_the_launchers_rlimits(tmp_path: Path) -> None:
    box = LocalSubprocessSandbox(tmp_path, SandboxLimits(max_file_bytes=1 << 20, cpu_time_s=7))
    assert box.run("ulimit -f; ulimit -t").stdout.split() == [str((1 << 20) // 512), "7"]
    assert box.run("head -c 2000000 /dev/zero > big").exit_code != 0 and (tmp_path / "big").stat().st_size == 1 << 20


def test_both_backends_exec_the_one_launcher(tmp_path: Path) -> None:
    local = LocalSubprocessSandbox(tmp_path)._argv(3)
    assert local[local.index(LAUNCHER) + 1 :] == ["-1", "3", *_rlimit_numbers(tmp_path)]  # no handshake fd
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed: only the local backend checked")
    from trl_thundersync.envs.runtimes.bwrap import BwrapSandbox

    argv = BwrapSandbox(tmp_path)._argv(4, 5, None)
    assert argv[argv.index(LAUNCHER) + 1 : argv.index(LAUNCHER) + 3] == ["4", "5"]


def _rlimit_numbers(tmp_path: Path) -> list[str]:
    """The local backend's rlimits as launcher arguments: CPU, AS and FSIZE, soft = hard (no NPROC on the host)."""
    limits = LocalSubprocessSandbox(tmp_path).limits
    triples = ((resource.RLIMIT_CPU, limits.cpu_time_s), (resource.RLIMIT_AS, limits.memory_bytes),
               (resource.RLIMIT_FSIZE, limits.max_file_bytes))
    return [str(v) for kind, value in triples for v in (kind, value, value)]


def test_commands_run_with_sigpipe_at_its_default_action(tmp_path: Path) -> None:
    """A writer into a closed pipe ends silently, as in a terminal's shell. Python ignores SIGPIPE, exec keeps an
    ignored signal ignored, and `yes` would then report "Broken pipe" on every run; for writers that finish in a
    race with their reader (`cat *.py | head -x`) the message came or not with the scheduler, and greedy episodes
    stopped being reproducible."""
    box = LocalSubprocessSandbox(tmp_path)
    result = box.run("yes | head -n 1")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "y\n", "")
    mask = next(line for line in box.run("grep SigIgn /proc/self/status").stdout.splitlines())
    assert not int(mask.split()[1], 16) & (1 << 12)  # bit 13 - 1: SIGPIPE is not ignored in the command
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed: only the local backend checked")
    from trl_thundersync.envs.runtimes.bwrap import BwrapSandbox

    sandboxed = BwrapSandbox(tmp_path).run("yes | head -n 1")
    assert (sandboxed.exit_code, sandboxed.stdout, sandboxed.stderr) == (0, "y\n", "")


# -- the shell launcher (prlimit + bash) ------------------------------------------------------------------------------

_PROBE = ("env | sort; echo \"0=$0 #=$#\"; ulimit -a; grep -E 'Sig(Ign|Blk|Cgt)' /proc/self/status; ls /proc/self/fd;"
          " printf '%s|' 'a\\b' \"$(printf 'x\\n\\n')\" 'é'; printf 'tail\\n\\n\\n'")


def _backends(tmp_path: Path) -> list:
    boxes = [LocalSubprocessSandbox(tmp_path)]
    if shutil.which("bwrap") is not None:
        from trl_thundersync.envs.runtimes.bwrap import BwrapSandbox

        boxes.append(BwrapSandbox(tmp_path))
    return boxes


@pytest.mark.skipif(not launcher.shell_launcher_available(), reason="no /usr/bin/prlimit or bash >= 4.1 here")
@pytest.mark.parametrize("env", [None, {"SHLVL": "3", "BASH_ENV": "/etc/passwd"}], ids=["plain", "caller-shlvl"])
def test_the_shell_launcher_gives_a_command_what_the_python_launcher_gives(tmp_path: Path, env, monkeypatch) -> None:
    """Environment (no SHLVL of bash's own, the caller's kept, BASH_ENV not read), rlimits, signal dispositions
    (SIGPIPE default, SIGXFSZ ignored), open fds, $0 and the command's bytes: the same through either launcher."""
    for box in _backends(tmp_path):
        fast = box.run(_PROBE, env=env)
        with monkeypatch.context() as patch:
            patch.setattr(launcher, "shell_launcher_argv", lambda *args: None)
            slow = box.run(_PROBE, env=env)
        assert fast.exit_code == slow.exit_code == 0 and fast.stderr == slow.stderr == ""
        assert fast.stdout == slow.stdout, type(box).__name__
        assert "SHLVL=3" in fast.stdout if env else "SHLVL" not in fast.stdout


@pytest.mark.skipif(not launcher.shell_launcher_available(), reason="no /usr/bin/prlimit or bash >= 4.1 here")
def test_commands_take_the_shell_launcher_unless_only_the_python_one_can_run_them(tmp_path: Path,
                                                                                monkeypatch) -> None:
    limits = [(resource.RLIMIT_CPU, 7, 8), (resource.RLIMIT_CORE, 0, 0)]
    fast = launcher.launcher_argv(4, 5, limits, b"echo hi", {"PATH": "/bin"})
    assert fast[:3] == [launcher.PRLIMIT, "--cpu=7:8", "--core=0:0"]
    assert fast[-4:] == ["launcher", "4", "5", "0"] and LAUNCHER not in fast
    assert launcher.launcher_argv(4, 5, limits, b"echo hi", {"SHLVL": "2"})[-1] == "1"
    for command in (b"echo a\0b", b"x" * launcher.MAX_ARG_STRLEN):  # only the Python launcher runs these
        assert LAUNCHER in launcher.launcher_argv(4, 5, limits, command)
    assert LAUNCHER in launcher.launcher_argv(4, 5, [(resource.RLIMIT_NOFILE, 9, 9)], b"echo hi")
    assert LAUNCHER in launcher.launcher_argv(4, 5, limits)  # no command bytes: the Python launcher
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (5, 6))  # a ceiling below the request: capped
    assert launcher.shell_launcher_argv(-1, 5, limits, b"true")[1] == "--cpu=6:6"
    monkeypatch.setattr(launcher, "shell_launcher_available", lambda: False)
    assert LAUNCHER in launcher.launcher_argv(4, 5, limits, b"echo hi")


@pytest.mark.skipif(not launcher.shell_launcher_available() or shutil.which("bwrap") is None,
                    reason="needs prlimit, bash >= 4.1 and bubblewrap")
def test_a_limit_prlimit_refuses_is_a_sandbox_failure_not_the_commands_exit(tmp_path: Path, monkeypatch) -> None:
    from trl_thundersync.envs.errors import SandboxError
    from trl_thundersync.envs.runtimes.bwrap import BwrapSandbox

    monkeypatch.setitem(launcher._PRLIMIT_OPTIONS, resource.RLIMIT_CORE, "--no-such-limit")
    with pytest.raises(SandboxError, match="failed before running the command"):
        BwrapSandbox(tmp_path).run("echo never")
