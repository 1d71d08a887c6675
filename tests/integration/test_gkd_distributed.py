"""ThunderSyncGKDTrainer on two CPU processes (DDP over gloo) equals one process on the same global batches.

Two launches of `gkd_parity_script.py` (one process, then `torchrun --nproc_per_node 2`) run every case; the tests
below compare them. Each process streams its own rows, seeded by their global row; N_k is the global scored-token
count and every process logs the global batch's metrics. Tolerances: the batch directions and final parameters
within 1e-5 relative (the DDP tests' tolerance; measured ≤ 1e-6 and ≤ 2e-9); the update θ_3 − θ_0 within 1e-4
(it inherits the FP32 rounding of θ itself: the update is ~1e-5 of |θ| here; measured ≤ 1.5e-5).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.parity import relative_error
from tests.fixtures.launch import free_port
from trl_thundersync.serve import EmbeddedServer, ServerThread
from trl_thundersync.tiny.model import save_tiny_model

pytestmark = pytest.mark.slow

PARITY = ("plain_gjsd", "plain_opd_ga2", "agent_opd", "agent_gjsd", "rank1_empty", "server_opd", "mixed_lmbda")


def _launch(out: Path, model_path: str, teacher_path: str, teacher_url: str, processes: int) -> dict:
    script = Path(__file__).parents[1] / "fixtures" / "gkd_parity_script.py"
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TRL_EXPERIMENTAL_SILENCE="1", TS_TEST_TEACHER_URL=teacher_url,
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    launcher = [] if processes == 1 else ["-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                                          "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    cmd = [sys.executable, *launcher, str(script), str(out), model_path, teacher_path]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out / "results.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_path):
    root = tmp_path_factory.mktemp("gkd_ddp")
    teacher_path = str(save_tiny_model(root / "tiny-teacher", hidden_size=96, num_layers=3, seed=7))
    with ServerThread(EmbeddedServer(teacher_path, max_in_flight=8)) as teacher:  # read-only, shared by all
        one = _launch(root / "one", tiny_model_path, teacher_path, teacher.url, processes=1)
        two = _launch(root / "two", tiny_model_path, teacher_path, teacher.url, processes=2)
    return one, two


@pytest.mark.parametrize("case", PARITY)
def test_two_processes_match_one_process(runs, case):
    one, two = runs[0][case], runs[1][case]
    assert len(one["directions"]) == len(two["directions"]) == 3
    assert two["policy_version"] == one["policy_version"] == 3
    assert one["directions"][0].norm() > 0
    for a, b in zip(two["directions"], one["directions"], strict=True):
        assert relative_error(a, b) <= 1e-5
    assert relative_error(two["params"], one["params"]) <= 1e-5
    assert relative_error(two["update"], one["update"]) <= 1e-4
    # every process logs the global batch's values: the counts exactly, the loss and the OPD KL to FP32 order
    assert len(two["logs"]) == len(one["logs"]) == 3
    for mine, theirs in zip(two["logs"], one["logs"], strict=True):
        assert mine.keys() == theirs.keys()
        for name in ("thundersync/scored_tokens", "thundersync/turns", "completions/mean_length", "agent/turns_mean",
                     "tools/call_frequency"):
            assert mine.get(name) == theirs.get(name), name
        for name in ("loss", "opd/reverse_kl"):
            if name in theirs:
                assert mine[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-8), name
    # each process streamed its own share: the shares add up to the one process's count
    assert sum(r["local_tokens"] for r in two["ranks"]) == one["local_tokens"]


def test_mixed_steps_take_the_same_branch_on_every_process(runs):
    """lmbda=0.5 draws both kinds of steps (seed 0: off, off, on); TRL's off-policy steps, scaled as one process's
    (`ThunderSyncGKDTrainer.compute_loss`), and the streamed one agree with one process (the parity test above)."""
    kinds = ["thundersync/on_policy" in h for h in runs[1]["mixed_lmbda"]["logs"]]
    assert kinds == ["thundersync/on_policy" in h for h in runs[0]["mixed_lmbda"]["logs"]]
    assert any(kinds) and not all(kinds)


def test_unequal_and_empty_shares(runs):
    two = runs[1]
    agent = [r["local_tokens"] for r in two["agent_opd"]["ranks"]]
    assert agent[0] != agent[1] and min(agent) > 0  # 2–4 turns by prompt: the processes stream different amounts
    assert [r["local_tokens"] for r in two["rank1_empty"]["ranks"]][1] == 0  # a process with zero scored tokens


def test_rank_zero_alone_publishes_to_the_shared_rollout_server(runs):
    main, follower = runs[1]["server_opd"]["ranks"]
    assert main["urls"] == follower["urls"] and len(main["urls"]) == 1
    assert main["owns_servers"] and main["has_publisher"]
    assert not follower["owns_servers"] and not follower["has_publisher"]
    assert main["trajectories"] == follower["trajectories"] == 3 * 2  # each process sampled its own 2 rows a step


def test_a_failed_teacher_on_one_process_stops_both_without_waiting(runs):
    main, follower = runs[1]["teacher_fails"]["ranks"]
    assert follower["error"] == "TeacherScoringError" and "died at its turn 3" in follower["message"]
    assert main["error"] == "PeerProcessError"
    assert "learner process 1 of 2" in main["message"] and "TeacherScoringError" in main["message"]
    assert main["steps"] == follower["steps"] == 1  # the second step was refused on both
    assert main["seconds"] < 60  # the exchange ran on both: no wait for a share that will not come


def test_no_scored_tokens_anywhere_is_refused_on_every_process(runs):
    ranks = runs[1]["all_empty"]["ranks"]
    assert [r["error"] for r in ranks] == ["NoScoredTokensError"] * 2
    assert all(r["steps"] == 0 for r in ranks)
