"""trace/summary.py and scripts.report_run: the end-of-run summary of the examples."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from trl_thundersync.examples_support.reports import report_run
from trl_thundersync.trace.export import write_jsonl
from trl_thundersync.trace.recorder import TRACE_FILE
from trl_thundersync.trace.records import StepTrace, TraceEvent
from trl_thundersync.trace.summary import export_run, format_summary, step_timings, summarize_run


def learner(start, end, ready):
    return TraceEvent("learner", "source_backward", start, end, ready=ready)


def step(k: int, t0: float, schedule: str = "thundersync") -> StepTrace:
    """R = 4 s; learner items at [1, 2] and [3, 5] (ready 1 and 3): busy 3, c_n = 5, idle 2, tail 1; P = 0.5."""
    events = (TraceEvent("rollout", "trajectory", t0, t0 + 4.0), learner(t0 + 1, t0 + 2, t0 + 1),
              learner(t0 + 3, t0 + 5, t0 + 3), TraceEvent("barrier", "optimizer", t0 + 5, t0 + 5.2))
    return StepTrace(step=k, schedule=schedule, start=t0, rollout_end=t0 + 4.0, learner_end=t0 + 5.0,
                     barrier_end=t0 + 5.2, publish_end=t0 + 5.5, events=events)


def test_step_timings_measure_the_trace():
    t = step_timings(step(0, 100.0))
    assert (t.rollout, t.learner_busy, t.learner_idle, t.learner_tail) == (4.0, 3.0, 2.0, 1.0)
    assert t.suffix == pytest.approx(0.5) and t.wall == pytest.approx(5.5)
    assert t.wall == pytest.approx(t.rollout + t.learner_tail + t.suffix)
    assert t.sync_equivalent == pytest.approx(7.5)


def test_concurrent_learner_items_count_once_as_busy_time():
    s = step(0, 0.0)
    s = StepTrace(**{**s.__dict__, "events": s.events + (learner(1.5, 2.5, 1.0),)})
    assert step_timings(s).learner_busy == pytest.approx(3.5)  # [1, 2.5] ∪ [3, 5]


def test_summary_picks_the_first_logged_quality_metric():
    history = [{"loss": 0.3, "reward": -2.0, "step": 1}, {"loss": 0.2, "reward": -1.0, "step": 2},
               {"train_runtime": 9.0}]
    s = summarize_run([step(0, 0.0), step(1, 10.0)], history, optimizer_steps=2)
    assert (s.metric, s.metric_values) == ("reward", (-2.0, -1.0))
    assert summarize_run([], [{"opd/reverse_kl": 0.5}], optimizer_steps=1).metric == "opd/reverse_kl"
    assert summarize_run([], [{"train_runtime": 1.0}], optimizer_steps=1).metric is None
    assert s.mean("wall") == pytest.approx(5.5) and s.mean("sync_equivalent") == pytest.approx(7.5)


def test_format_summary_states_steps_metric_timings_and_files(tmp_path):
    s = summarize_run([step(0, 0.0)], [{"reward": -2.0}, {"reward": -1.0}], optimizer_steps=2,
                      files=[("trace", tmp_path / "steps.jsonl")])
    text = format_summary(s)
    assert text.startswith("run summary: 2 optimizer steps; reward -2 (first logged step) → -1 (last), mean -1.5")
    assert "wall 5.50s = rollout 4.00s + learner tail 1.00s + barrier/optimizer/publish 0.50s" in text
    assert "learner busy 3.00s, idle 2.00s" in text and "(R + L + P) would take 7.50s: 1.36x from overlap" in text
    assert f"trace: {tmp_path / 'steps.jsonl'}" in text
    assert "no trace recorded" in format_summary(summarize_run([], [], optimizer_steps=0))


def test_export_run_writes_chrome_trace_and_timeline(tmp_path):
    files = dict(export_run([step(k, 10.0 * k) for k in range(10)], tmp_path))
    chrome = files["Chrome/Perfetto trace (https://ui.perfetto.dev)"]
    assert chrome == tmp_path / "trace.json" and chrome.stat().st_size > 0
    if importlib.util.find_spec("matplotlib") is not None:
        assert files["timeline"] == tmp_path / "timeline.png" and files["timeline"].stat().st_size > 0
    assert export_run([], tmp_path) == []


def fake_trainer(output_dir: Path, main: bool = True, trace: bool = True):
    return SimpleNamespace(accelerator=SimpleNamespace(is_main_process=main),
                           args=SimpleNamespace(output_dir=str(output_dir), trace=trace),
                           state=SimpleNamespace(global_step=2, log_history=[{"reward": 0.5}, {"reward": 0.75}]))


def test_report_run_prints_the_summary_of_a_trainers_trace(tmp_path, capsys):
    write_jsonl([step(0, 0.0), step(1, 10.0)], tmp_path / TRACE_FILE)
    summary = report_run(fake_trainer(tmp_path))
    out = capsys.readouterr().out
    assert summary.optimizer_steps == 2 and len(summary.steps) == 2
    assert "run summary: 2 optimizer steps; reward 0.5" in out and str(tmp_path / TRACE_FILE) in out
    assert (tmp_path / TRACE_FILE).parent.joinpath("trace.json").exists()
    assert report_run(fake_trainer(tmp_path, main=False)) is None and capsys.readouterr().out == ""
    assert report_run(fake_trainer(tmp_path, trace=False)).steps == ()
