"""Two CPU processes (DDP over gloo): ThunderSync's averaged batch direction equals stock TRL's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from benchmarks.parity import relative_error
from tests.fixtures.logged_metrics import assert_logs_match_one_process

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The stock-TRL cases of `ddp_parity_script.py` on the session's tiny model that tests here and in
# test_distributed_metrics / test_num_iterations / test_entropy_bonus compare: all of them run in one two-process
# launch, the first time any of them is asked for (a launch costs two interpreter starts and a process group).
SESSION_CASES = ("dapo", "grpo_batch_beta", "bnpo_ga2", "batch_relative_content", "normalize_then_sum", "metrics",
                 "mu2_bnpo_ga2_beta", "entropy_adaptive_ga2")
_session_runs: dict[str, Path] = {}  # model path -> the folder holding every SESSION_CASES result


def launch_ddp_parity(folder: Path, model_path: str, cases: str, processes: int = 2,
                      extra_env: dict[str, str] | None = None) -> None:
    """`ddp_parity_script.py` with `cases` (comma separated) on `processes` CPU processes (gloo), into `folder`."""
    script = Path(__file__).parents[1] / "fixtures" / "ddp_parity_script.py"
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TRL_EXPERIMENTAL_SILENCE="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]), **(extra_env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(script), str(folder), model_path, cases]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300 * len(cases.split(",")), env=env)
    assert done.returncode == 0, done.stderr[-4000:]


def run_ddp_parity(tmp_path, model_path: str, case: str, processes: int = 2,
                   extra_env: dict[str, str] | None = None) -> tuple[dict, dict]:
    """`ddp_parity_script.py` case `case` on `processes` CPU processes (gloo): stock TRL's and ThunderSync's results
    (`directions` per optimizer step, final `params`; TRL's is None for the server cases). A SESSION_CASES case on
    two processes is read from the session's one launch of all of them."""
    if case in SESSION_CASES and processes == 2 and not extra_env:
        if model_path not in _session_runs:
            folder = Path(tempfile.mkdtemp(prefix="ddp-parity-", dir=tmp_path.parent))
            launch_ddp_parity(folder, model_path, ",".join(SESSION_CASES))
            _session_runs[model_path] = folder
        results = torch.load(_session_runs[model_path] / f"results-{case}.pt")
    else:
        launch_ddp_parity(tmp_path, model_path, case, processes, extra_env)
        results = torch.load(tmp_path / ("results.pt" if case.startswith("server_") else f"results-{case}.pt"))
    return results["trl"], results["ts"]


@pytest.mark.parametrize("case", ["dapo", "grpo_batch_beta", "bnpo_ga2", "batch_relative_content",
                                  "normalize_then_sum"])
def test_two_processes_match_trl(case, tmp_path, tiny_model_path):
    ref, got = run_ddp_parity(tmp_path, tiny_model_path, case)
    assert len(ref["directions"]) == len(got["directions"]) == 2
    for a, b in zip(got["directions"], ref["directions"], strict=True):
        assert relative_error(a, b) <= 1e-5
    assert relative_error(got["params"], ref["params"]) <= 1e-5


def test_groups_spanning_processes_are_refused(tmp_path, tiny_model_path):
    launch_ddp_parity(tmp_path, tiny_model_path, "straddle")
    message = (tmp_path / "error.txt").read_text()
    assert "per_device_train_batch_size × steps_per_generation = 3" in message and "num_generations=2" in message


def _server_run(tmp_path, model_path: str, case: str, processes: int) -> dict:
    """ThunderSync's results of `case` on `processes` processes; `server_external` gets a fresh server started here
    from other weights than the policy's (halved), so the run must publish θ_0 before its first batch."""
    if case != "server_external":
        return run_ddp_parity(tmp_path, model_path, case, processes)[1]
    from transformers import AutoTokenizer

    from benchmarks.parity import load_model
    from trl_thundersync.serve.launcher import EmbeddedServers, ServerOptions

    other = load_model(model_path)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    servers = EmbeddedServers.start(other, AutoTokenizer.from_pretrained(model_path), replicas=1,
                                    options=ServerOptions(max_in_flight=4))
    try:
        return run_ddp_parity(tmp_path, model_path, case, processes, {"TS_TEST_SERVER_URL": servers.urls[0]})[1]
    finally:
        servers.close()


@pytest.mark.parametrize("case", ["server_full", "server_lora", "server_external"])
def test_two_processes_sharing_one_rollout_server_match_one_process(case, tmp_path, tiny_model_path):
    """Rank 0 starts the embedded server (or finds the external one) and publishes θ_{k+1} (full weights, or the
    adapter once per version); both ranks sample their own rows from that one server (seeds by global row), so
    3 steps equal one process on the same global batch."""
    one = _server_run(tmp_path / "one", tiny_model_path, case, processes=1)
    two = _server_run(tmp_path / "two", tiny_model_path, case, processes=2)
    assert len(one["directions"]) == len(two["directions"]) == 3
    for a, b in zip(two["directions"], one["directions"], strict=True):
        assert relative_error(a, b) <= 1e-5
    assert relative_error(two["params"], one["params"]) <= 1e-5
    main, follower = two["ranks"]
    assert main["urls"] == follower["urls"] and len(main["urls"]) == 1  # one server, shared
    assert main["owns_servers"] == (case != "server_external") and main["has_publisher"]
    assert not follower["owns_servers"] and not follower["has_publisher"]  # the follower never publishes
    assert main["trajectories"] == follower["trajectories"] == 3 * 4  # each rank sampled its own 4 rows per step
    assert main["policy_version"] == follower["policy_version"] == one["ranks"][0]["policy_version"] == 3
    for rank in two["ranks"]:  # every rank logs the one-process metrics (`trainers/grpo_metrics.py`)
        assert_logs_match_one_process(rank["logs"], one["ranks"][0]["logs"])
