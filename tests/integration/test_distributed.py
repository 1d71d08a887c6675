"""Two CPU processes (DDP over gloo): ThunderSync's averaged batch direction equals stock TRL's."""

from __future__ import annotations

import pytest

from benchmarks.parity import relative_error
from tests.fixtures.ddp_parity import _server_run, launch_ddp_parity, run_ddp_parity
from tests.fixtures.logged_metrics import assert_logs_match_one_process

pytestmark = pytest.mark.slow


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
    for rank in two["ranks"]:  # every rank logs the one-process metrics (`trainers/grpo/metrics.py`)
        assert_logs_match_one_process(rank["logs"], one["ranks"][0]["logs"])
