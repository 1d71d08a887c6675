"""ThunderSync GRPO under DeepSpeed ZeRO on two CPU processes equals one plain process on the same global batch.

Each case is one 2-process launch (`deepspeed_parity_script.py`, DeepSpeed's CPU accelerator over gloo) and one
single-process reference run (in this process): 3 optimizer steps with clipping active, unequal token counts per
rank, unscorable rewards on some rows. Compared: every step's pre-clip gradient norm (a wrong reduction scale shows
there even where clipping or Adam hide it in the parameters) and the whole 3-step parameter update.
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

pytest.importorskip("deepspeed", reason="DeepSpeed is installed by scripts/setup.sh (CI)")
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "fixtures" / "deepspeed_parity_script.py"


def _two_processes(out: Path, model_path: str, case: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TRL_EXPERIMENTAL_SILENCE="1", DS_ACCELERATOR="cpu",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(SCRIPT), str(out), model_path, case]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out / "results.pt")


def _one_process(out: Path, model_path: str, case: str) -> dict:
    """The reference, in this process (plain single-process ThunderSync: no launcher, no DeepSpeed)."""
    from tests.fixtures.deepspeed_parity_script import main

    out.mkdir(parents=True, exist_ok=True)
    main(out, model_path, f"one_{case}")
    return torch.load(out / "results.pt")


@pytest.mark.parametrize(("case", "stage"), [("zero1", 1), ("zero2", 2), ("zero3", 3)])
def test_zero_two_processes_match_one_process(case, stage, tmp_path, tiny_model_path):
    """zero1: AdamW, one micro-step per window; zero2: SGD, gradient_accumulation_steps=2 (the direction reaches the
    engine at the window's second micro-step) and beta=0.1 (TRL's reference model prepared by DeepSpeed); zero3:
    SGD, the policy partitioned at load, per-source passes on each rank's unsharded replica, samples from one
    embedded rollout server that rank 0 starts and publishes the replica to (θ_k before every step)."""
    one = _one_process(tmp_path / "one", tiny_model_path, case)
    two = _two_processes(tmp_path / "two", tiny_model_path, case)
    assert one["placement"] == "single process" and two["placement"] == f"DeepSpeed ZeRO-{stage}"
    assert one["steps"] == two["steps"] == 3 and len(one["grad_norms"]) == len(two["grad_norms"]) == 3
    assert torch.equal(one["initial"], two["initial"])
    assert min(one["grad_norms"]) > 0.5  # max_grad_norm=0.5: clipping is active in every step
    for a, b in zip(two["grad_norms"], one["grad_norms"], strict=True):
        assert abs(a - b) <= 1e-5 * b
    update_one, update_two = one["params"] - one["initial"], two["params"] - two["initial"]
    assert relative_error(update_two, update_one) <= 1e-5
