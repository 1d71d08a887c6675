"""Smoke test of `python -m benchmarks`: a tiny preset end to end, no timing thresholds.

Three schedules (sync, thundersync, stock TRL) each run in their own process on the same sandboxed agentic
workload; the command must print the table, write the JSON report, the Chrome trace and the PNGs.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from benchmarks.__main__ import main

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
        # the training_step thread's CPU, one record per step (warm-up included in the run's record)
        run = point["runs"][schedule][0]
        assert len(run["learner_thread_cpu"]) == len(run["step_intervals"]), schedule
        assert stats["learner_cpu_s"] > 0 and stats["learner_preemptions"] >= 0, schedule
        assert f"learner thread {schedule}: CPU" in printed
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


def test_release_points_with_grading_latency(tmp_path, capsys):
    """`--release reward,content` runs one ThunderSync schedule per release point; every learner item of their
    traces carries its trajectory's content-ready and reward times, and each is predicted from the sync trace."""
    from trl_thundersync.trace.export import read_jsonl

    out = tmp_path / "release.json"
    main(["--preset", "smoke", "--release", "reward,content", "--schedules", "sync,thundersync",
          "--grading-latency", "0.05", "--out", str(out)])
    printed = capsys.readouterr().out
    names = ("sync", "thundersync:reward", "thundersync:content")
    table = [line.split()[0] for line in printed.splitlines() if line.split()]
    for schedule in names:
        assert schedule in table, f"no table row for {schedule}:\n{printed}"
    assert "overlap cost per side" in printed and "(replay of sync)" in printed

    data = json.loads(out.read_text())
    point = data["points"][0]
    assert data["schedules"] == list(names) and point["workload"]["grading_latency"] == 0.05
    c = point["compare"]
    assert set(c["predicted_from_sync"]) == set(c["predicted_from_reward"]) == set(names[1:])
    assert all(v > 0 for v in c["predicted_from_sync"].values())
    assert set(c["overlap_vs_sync"]) == set(names[1:])
    for schedule in names:
        assert set(point["schedules"][schedule]["replay_release_s"]) == {"reward", "content", "turn"}
    assert {r["release"] for r in point["runs"]["thundersync:content"]} == {"content"}

    kinds = {}
    for schedule in names:
        steps = read_jsonl(point["runs"][schedule][0]["trace"])
        learner = [e for s in steps for e in s.events if e.lane == "learner" and e.index >= 0]
        kinds[schedule] = {e.kind for e in learner}
        for e in learner:  # every per-trajectory item knows its content-ready time; a reward-time item its reward
            assert e.content_ready is not None, (schedule, e)
            assert e.reward_at is not None or e.kind == "content_backward", (schedule, e)
        assert any(e.kind == "reward" for s in steps for e in s.events), schedule
    assert kinds["sync"] == kinds["thundersync:reward"] == {"source_backward"}
    assert {"content_backward", "bind"} <= kinds["thundersync:content"]
    trace = json.loads(open(data["files"]["chrome_trace"]).read())
    assert {e["args"]["schedule"] for e in trace["traceEvents"] if e.get("cat") == "step"} == set(names)
