"""Several learner nodes (issue 13 item 6), simulated on this machine: two `accelerate launch` commands, one per
"node" (`--num_machines 2 --machine_rank 0/1`, one CPU process each), meet at a rendezvous on loopback and sample
from one rollout server started separately (as `vllm serve` would be on a server node), reached through
`vllm_server_base_urls`. Three steps equal one process on the same global batch.

The run is `ddp_parity_script.py`'s `server_external` case: the server starts from other weights than the policy's
(halved), so rank 0 must publish θ_0 before the first batch, then θ_1, θ_2 after each step.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from benchmarks.parity import relative_error
from tests.fixtures.ddp_parity import _server_run
from tests.fixtures.launch import launch_nodes

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parents[1] / "fixtures" / "ddp_parity_script.py"


@contextmanager
def separate_server(model_path: str):
    """One embedded server in its own process, started here from halved weights (not the policy's): the learners
    know it only by its URL."""
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
        yield servers.urls[0]
    finally:
        servers.close()


def test_two_nodes_on_loopback_sharing_a_separate_server_match_one_process(tmp_path, tiny_model_path):
    one = _server_run(tmp_path / "one", tiny_model_path, "server_external", processes=1)
    with separate_server(tiny_model_path) as url:
        (tmp_path / "two").mkdir()
        nodes = launch_nodes(SCRIPT, str(tmp_path / "two"), tiny_model_path, "server_external",
                             extra_env={"TS_TEST_SERVER_URL": url})
    for rank, node in enumerate(nodes):
        assert node.returncode == 0, f"node {rank}: exit {node.returncode}\n{node.stderr[-4000:]}"
    two = torch.load(tmp_path / "two" / "results.pt")["ts"]
    assert len(one["directions"]) == len(two["directions"]) == 3
    for a, b in zip(two["directions"], one["directions"], strict=True):
        assert relative_error(a, b) <= 1e-5
    assert relative_error(two["params"], one["params"]) <= 1e-5
    main, follower = two["ranks"]
    assert (main["node"], follower["node"]) == (0, 1)  # torchrun's node rank (GROUP_RANK) of each process
    assert list(main["urls"]) == list(follower["urls"]) == [url]  # the separate server, by its URL from each node
    assert not main["owns_servers"] and not follower["owns_servers"]
    assert main["has_publisher"] and not follower["has_publisher"]  # node 0's process alone publishes
    assert main["trajectories"] == follower["trajectories"] == 3 * 4  # each node sampled its own 4 rows per step
    assert main["policy_version"] == follower["policy_version"] == 3
