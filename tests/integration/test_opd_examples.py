"""The distillation examples run on CPU with the bundled tasks and the sandbox. The random-weight tiny models stand in
for the default tiny agents here (same code path, no minute-long warm start per test run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
                       reason="needs bubblewrap (Debian package `bubblewrap`)"),
]


@pytest.mark.parametrize("suite", ["terminal", "swe"])
def test_example_runs(tmp_path, suite):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "swe_opd.py"), "--suite", suite, "--max_steps", "1",
         "--per_device_train_batch_size", "2", "--max_new_tokens", "24", "--output_dir", str(tmp_path / "out"),
         "--model_name_or_path", "tiny",
         "--teacher_model_name_or_path", "tiny", "--tiny_model_dir", str(tmp_path / "student"),
         "--tiny_teacher_dir", str(tmp_path / "teacher")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done: 1 optimizer steps" in out.stdout
    assert (tmp_path / "out" / "thundersync_trace" / "steps.jsonl").exists()
