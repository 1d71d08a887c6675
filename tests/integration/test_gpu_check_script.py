"""`scripts/gpu_check.py --device cpu --quick`: every check of the GPU check script runs in tiny form on the CPU
(so the script a lent GPU machine runs is not dead code), the CUDA-only one is skipped with its reason, the JSON
report has the numbers the GPU run is read by."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_quick_cpu_run_passes_every_check_it_can_and_names_what_it_skipped(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = report["checks"]
    assert set(checks) == {"grpo_exactness", "gkd_exactness", "throughput", "placements", "publication"}
    assert {n: c["status"] for n, c in checks.items()} == {
        "grpo_exactness": "pass", "gkd_exactness": "pass", "throughput": "pass", "placements": "skipped",
        "publication": "pass"}
    assert "CUDA" in checks["placements"]["reason"]
    for row in [*checks["grpo_exactness"]["numbers"].values(), checks["gkd_exactness"]["numbers"]]:
        assert 0 < row["fp32_rel_error"] <= 1e-5 and row["fp32_floor"] > 0
        assert row["bf16_ts_vs_fp32"] <= 2 * max(row["bf16_trl_vs_fp32"], 1e-5)
    ts = checks["throughput"]["numbers"]["ts"]
    assert ts["tokens_per_step"] == checks["throughput"]["numbers"]["trl"]["tokens_per_step"] > 0
    assert ts["learner_busy_seconds"] > 0 and ts["stats_bound_mb"] > 0
    publication = checks["publication"]["numbers"]
    assert publication["tensors"] > 0 and 0 < publication["max_rel_dev"] <= publication["bf16_tol"]
    assert "skipped: placements" in done.stdout and report["meta"]["seconds"] < 120
