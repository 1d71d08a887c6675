"""The time-to-quality benchmark's distillation run (`benchmarks/time_to_quality.py --trainer gkd`) end to end on a
tiny budget: ThunderSyncGKDTrainer on the thermostat suite with held-out evaluations; no timing thresholds."""

from __future__ import annotations

import math
import os
import shutil

import pytest

from benchmarks.time_to_quality import QualityWorkload, analyse, run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
                       reason="the thermostat tasks run their scripts in the bubblewrap sandbox"),
]


def test_a_distillation_run_logs_its_loss_and_held_out_success_before_and_after(tmp_path, tiny_agent) -> None:
    w = QualityWorkload.for_suite("thermostat", "gkd", steps=1, batch=2, eval_every=1, eval_samples=1,
                                  max_new_tokens=16, agent_max_turns=2)
    result = run({"schedule": "thundersync", "seed": 0, "workload": w.to_dict(), "out_dir": str(tmp_path),
                  "model_dir": tiny_agent, "teacher_dir": tiny_agent})
    assert [p["step"] for p in result["points"]] == [1]
    # the session's tiny agent distilled from itself: a finite generalized JSD, 0 on every sampled turn up to FP32
    # rounding (which can make it a few 1e-9 negative: -3.8e-9 seen)
    assert math.isfinite(result["points"][0]["reward"]) and -1e-6 <= result["points"][0]["reward"] < 1e-3
    assert [h[0] for h in result["heldout"]] == [0, 1] and all(0.0 <= h[2] <= 1.0 for h in result["heldout"])
    row = analyse([result], level=None, window=1, heldout_level=0.0)["rows"][0]
    assert row["seconds_to_level"] is None and row["step_to_heldout"] == 0, "level 0 is reached before training"
