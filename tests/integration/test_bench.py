"""Smoke test of `python -m trl_thundersync.bench`: a tiny preset end to end, no timing thresholds.

Three schedules (sync, thundersync, stock TRL) each run in their own process on the same sandboxed agentic
workload; the command must print the table, write the JSON report, the Chrome trace and the PNGs.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from trl_thundersync.bench.__main__ import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
                       reason="the benchmark's tool runs real commands in the bubblewrap sandbox"),
]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_smoke_preset_runs_three_schedules_and_writes_reports(tmp_path, capsys):
    out = tmp_path / "smoke.json"
    report = main(["--preset", "smoke", "--out", str(out)])
    printed = capsys.readouterr().out

    table = [line.split()[0] for line in printed.splitlines() if line.split()]
    for schedule in ("sync", "thundersync", "trl"):
        assert schedule in table, f"no table row for {schedule}:\n{printed}"
    assert "predicted" in printed and "[3/3]" in printed

    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(report))
    point = data["points"][0]
    assert set(point["schedules"]) == {"sync", "thundersync", "trl"}
    for schedule, stats in point["schedules"].items():
        assert stats["steps"] >= 1 and stats["step_wall_s"] > 0, schedule
        assert stats["peak_rss_mb"] > 0 and stats["learner_busy_s"] > 0
    assert point["schedules"]["thundersync"]["stats_peak_mb"] > 0
    assert point["compare"]["predicted_speedup"] > 0 and point["compare"]["measured_speedup_step"] > 0
    assert data["machine"]["nproc"] >= 1

    files = data["files"]
    for key in ("timeline_png", "speedup_png"):
        assert open(files[key], "rb").read(8) == PNG_MAGIC, key
    trace = json.loads(open(files["chrome_trace"]).read())
    schedules_traced = {e["args"]["schedule"] for e in trace["traceEvents"] if e.get("cat") == "step"}
    assert schedules_traced == {"sync", "thundersync", "trl"}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--pin splits the learner and rollout onto 2 CPUs")
def test_pinned_runs_record_their_core_split(tmp_path, capsys):
    out = tmp_path / "pinned.json"
    main(["--preset", "smoke", "--pin", "--schedules", "sync,thundersync", "--out", str(out)])
    assert "learner pinned to one core" in capsys.readouterr().out
    point = json.loads(out.read_text())["points"][0]
    for schedule in ("sync", "thundersync"):
        pinning = point["runs"][schedule][0]["pinning"]
        assert len(pinning["learner"]) == 1 and pinning["rollout"]
        assert not set(pinning["learner"]) & set(pinning["rollout"])
        assert point["runs"][schedule][0]["learner_thread_cpus"] == pinning["learner"]
