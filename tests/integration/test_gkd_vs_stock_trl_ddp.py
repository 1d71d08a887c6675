"""ThunderSyncGKDTrainer against stock `GKDTrainer` on two CPU processes (DDP over gloo), on identical completions
(`gkd_stock_ddp_script.py`; the seams and cases of test_gkd_vs_stock_trl.py). With its defaults a swapped script
trains as stock TRL does under DDP: each process divides its loss by the gathered `num_items_in_batch` and DDP
averages (1/2 of the one-process step), on-policy and off-policy steps alike. Every step's clipped direction within
2× (AdamW 3×) of the floor: stock TRL against itself with each process's rows reversed or rotated, or its completions
padded (`tests/fixtures/floors.py`).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fixtures.floors import assert_within_floor
from tests.fixtures.gkd_stock import CASES, FLOOR_RUNS, relative_error
from tests.fixtures.launch import free_port
from trl_thundersync.tiny.model import save_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.exactness]  # the exactness layer (scripts/kernel_passes.sh)
SCRIPT = Path(__file__).parents[1] / "fixtures" / "gkd_stock_ddp_script.py"
DDP_CASES = ("beta0.5", "accumulation", "clipping", "mixed_lmbda", "mixed_lmbda_accumulation_seed3", "adamw_3steps")


@pytest.fixture(scope="module")
def results(tmp_path_factory, tiny_model_path):
    root = tmp_path_factory.mktemp("gkd_stock_ddp")
    teacher = str(save_tiny_model(root / "tiny-teacher", hidden_size=96, num_layers=3, seed=7))
    env = dict(os.environ, OMP_NUM_THREADS="1", TRL_EXPERIMENTAL_SILENCE="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(SCRIPT), str(root), tiny_model_path, teacher]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(root / "results.pt")


@pytest.mark.parametrize("case", DDP_CASES)
def test_gjsd_on_two_processes_equals_stock_gkd_on_two_processes(results, case):
    stock, ours = results[case]["stock"], results[case]["ts"]
    floor_runs = {name: results[case][name] for name in FLOOR_RUNS}
    factor = 3.0 if "adamw" in case else 2.0
    on_policy = [h for h in ours["logs"] if "thundersync/on_policy" in h]
    assert stock["update"].norm() > 0 and on_policy
    assert any(h["thundersync/normalizer_tokens"] != h["thundersync/scored_tokens"] for h in on_policy)
    if case.startswith("mixed_lmbda_accumulation"):  # windows mixing both kinds of micro-steps, on both processes
        random.seed(CASES[case].get("seed", 0))
        draws = [random.random() <= 0.5 for _ in range(2 * CASES[case]["max_steps"])]
        assert {(True, False), (False, True)} & set(zip(draws[::2], draws[1::2], strict=True))
    assert len(ours["directions"]) == len(stock["directions"])
    for step, (mine, theirs) in enumerate(zip(ours["directions"], stock["directions"], strict=True)):
        floors = {name: (lambda run=run, k=step, b=theirs: relative_error(run["directions"][k], b))
                  for name, run in floor_runs.items()}
        assert_within_floor(relative_error(mine, theirs), floors, factor=factor, what=f"{case} step {step + 1}")
    if "adamw" in case:
        assert_within_floor(relative_error(ours["update"], stock["update"]),
                            {name: (lambda run=run: relative_error(run["update"], stock["update"]))
                             for name, run in floor_runs.items()}, factor=factor, what=f"{case} parameters")
    losses = [h["loss"] for h in ours["logs"] if "loss" in h]
    assert losses == pytest.approx([h["loss"] for h in stock["logs"] if "loss" in h], rel=1e-4)
