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
    reason = checks["placements"]["reason"]
    assert "CUDA" in reason and "the plain reference run worked" in reason and "single process" in reason
    for row in [*checks["grpo_exactness"]["numbers"].values(), checks["gkd_exactness"]["numbers"]]:
        assert 0 < row["fp32_rel_error"] <= 1e-5 and row["fp32_floor"] > 0
        assert row["bf16_ts_vs_fp32"] <= 2 * max(row["bf16_trl_vs_fp32"], 1e-5)
    ts = checks["throughput"]["numbers"]["ts"]
    assert ts["tokens_per_step"] == checks["throughput"]["numbers"]["trl"]["tokens_per_step"] > 0
    assert ts["learner_busy_seconds"] > 0 and ts["stats_bound_mb"] > 0
    publication = checks["publication"]["numbers"]
    assert publication["tensors"] > 0 and 0 < publication["max_rel_dev"] <= publication["bf16_tol"]
    assert "skipped: placements" in done.stdout and report["meta"]["seconds"] < 120


def test_a_check_that_raises_is_a_failure_with_its_error_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)

    def broken(work, device):
        raise RuntimeError("CUDA error: an illegal memory access")

    def skipped(work, device, quick):
        raise gpu_check.runs.SkippedCheck("`import trl` failed: ModuleNotFoundError")

    monkeypatch.setattr(gpu_check.runs, "gkd_exactness", broken)
    monkeypatch.setattr(gpu_check.runs, "backward_throughput", skipped)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--quick", "--out", str(tmp_path), "--only",
                                      "gkd_exactness", "throughput", "publication"])
    assert gpu_check.main() == 1  # a failed check fails the run; the checks after it still ran
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert [(n, c["status"]) for n, c in checks.items()] == [
        ("gkd_exactness", "FAIL"), ("throughput", "skipped"), ("publication", "pass")]
    assert "illegal memory access" in checks["gkd_exactness"]["error"] and checks["gkd_exactness"]["traceback"]
    assert "import trl" in checks["throughput"]["reason"]
    out = capsys.readouterr().out
    assert "FAIL: gkd_exactness" in out and "skipped: throughput" in out and "pass: publication" in out


def test_checks_past_the_budget_are_skipped_by_name(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_budget", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--quick", "--out", str(tmp_path),
                                      "--budget-s", "-1", "--only", "publication"])
    assert gpu_check.main() == 0
    check = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]["publication"]
    assert check["status"] == "skipped" and "budget of -1.0s" in check["reason"]
