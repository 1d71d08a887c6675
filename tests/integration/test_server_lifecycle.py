"""The trainer owns its embedded rollout servers: a server killed mid-batch is restarted (same weights, same seeds,
so the same update) or fails the run within seconds; Ctrl-C and SIGTERM end the run promptly and leave no server
process and no `thundersync-*` folder behind.

Each test runs `server_lifecycle_script.py` (a two-step GRPO run on one embedded server) in a subprocess with its own
TMPDIR. The time bounds below are hang detectors (the failures they catch took 300 s), not speed thresholds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.parity import relative_error

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "fixtures" / "server_lifecycle_script.py"
REPO = Path(__file__).resolve().parents[2]
HANG_S = 60.0  # far above the few seconds these take, far below the 300 s of the defects


def _start(model: str, out: Path, *args: str) -> subprocess.Popen:
    tmp = out / "tmp"
    tmp.mkdir(parents=True)
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = (out / "log").open("wb")
    # SIGINT as a terminal gives it: a background job of a non-interactive shell inherits SIG_IGN (POSIX), and Python
    # then installs no KeyboardInterrupt handler in the child
    return subprocess.Popen([sys.executable, str(SCRIPT), model, str(out), *args], env=env, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _finish(process: subprocess.Popen, out: Path, timeout: float = 600.0) -> str:
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return (out / "log").read_text(errors="replace")


def _await_batch(process: subprocess.Popen, out: Path) -> None:
    """Until the first reward of the first batch is scored (the batch is still generating)."""
    deadline = time.monotonic() + 300.0
    while not (out / "in_batch").exists():
        assert process.poll() is None, (out / "log").read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the run never reached its first batch"
        time.sleep(0.05)


def _servers_of(tmp: Path) -> list[int]:
    """Pids of rollout servers serving a policy folder under `tmp` (they outlive a SIGKILLed parent briefly)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"trl_thundersync.serve" in cmdline and any(str(tmp).encode() in part for part in cmdline):
            pids.append(int(entry.name))
    return pids


def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("thundersync-"))


def _await_clean(tmp: Path, seconds: float = 30.0) -> tuple[list[str], list[int]]:
    """Folders and server processes of the run still there after `seconds` (servers notice their parent's death
    within about a second)."""
    deadline = time.monotonic() + seconds
    while (_leftovers(tmp) or _servers_of(tmp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _leftovers(tmp), _servers_of(tmp)


@pytest.fixture(scope="module")
def undisturbed(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("undisturbed")
    log = _finish(_start(tiny_model_path, out), out)
    assert (out / "result.pt").exists(), log[-3000:]
    return torch.load(out / "result.pt")


def test_a_killed_embedded_server_is_restarted_and_the_run_matches_an_undisturbed_one(tiny_model_path, tmp_path,
                                                                                     undisturbed):
    # killed during batch 1, after θ_1 was published: the restarted server starts from θ_0 and must get θ_1 back
    process = _start(tiny_model_path, tmp_path, "--kill-server-at-step", "1")
    log = _finish(process, tmp_path)
    assert process.returncode == 0, log[-3000:]
    result = torch.load(tmp_path / "result.pt")
    assert result["restarts"] == 1.0
    assert result["samples"] == undisturbed["samples"]  # same seeds, same weights: the same trajectories
    assert relative_error(result["params"], undisturbed["params"]) <= 1e-6  # arrival order may differ
    assert _await_clean(tmp_path / "tmp") == ([], [])


def test_a_killed_embedded_server_without_restarts_fails_within_seconds_with_its_exit_code(tiny_model_path,
                                                                                          tmp_path):
    process = _start(tiny_model_path, tmp_path, "--kill-server-at-step", "0", "--restarts", "0")
    _await_batch(process, tmp_path)
    killed = time.monotonic()
    log = _finish(process, tmp_path, timeout=HANG_S)
    assert time.monotonic() - killed < HANG_S
    assert process.returncode == 1
    assert "RolloutError" in log and "killed by SIGKILL" in log and "rollout_server_restarts" in log, log[-3000:]
    assert _await_clean(tmp_path / "tmp") == ([], [])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_mid_batch_ends_the_run_promptly_and_leaves_nothing_behind(tiny_model_path, tmp_path, signum):
    process = _start(tiny_model_path, tmp_path)
    _await_batch(process, tmp_path)
    process.send_signal(signum)
    signalled = time.monotonic()
    log = _finish(process, tmp_path, timeout=HANG_S)
    assert time.monotonic() - signalled < HANG_S, log[-3000:]
    assert process.returncode == -signum  # KeyboardInterrupt re-raises SIGINT at exit; SIGTERM kills outright
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in log
    assert _await_clean(tmp_path / "tmp") == ([], [])
