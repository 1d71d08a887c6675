"""learning.py (reward / held-out curves against steps and training seconds) and the time-to-quality analysis."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.time_to_quality import analyse, time_to_level
from trl_thundersync.errors import ConfigurationError
from trl_thundersync.learning import CurvePoint, LearningCurve, first_reaching, smoothed, window_means


def _points(rewards, step_s=2.0):
    return [CurvePoint(step=i + 1, seconds=step_s * (i + 1), reward=r, heldout=None) for i, r in enumerate(rewards)]


def test_smoothed_is_a_trailing_mean() -> None:
    assert smoothed([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert smoothed([], 3) == []


def test_window_means_and_first_reaching() -> None:
    points = _points([0.1, 0.2, 0.3, 0.5, 0.7, 0.9])
    assert window_means(points, 2) == (pytest.approx(0.15), pytest.approx(0.8))
    assert window_means(points[:3], 5) == (pytest.approx(0.1), pytest.approx(0.3))  # cut to half the points
    with pytest.raises(ConfigurationError):
        window_means([], 5)
    assert first_reaching([(1.0, 0.1), (2.0, 0.4), (3.0, 0.6)], 0.4) == 2.0
    assert first_reaching([(1.0, 0.1)], 0.4) is None


def test_the_curve_records_steps_and_stops_its_clock_while_evaluating(monkeypatch) -> None:
    """Held-out evaluations run before training, every `every` steps and after the last one; their time is not
    training time."""
    clock = [0.0]
    monkeypatch.setattr("trl_thundersync.learning.time.perf_counter", lambda: clock[0])

    def evaluate(model, processing_class):
        clock[0] += 100.0  # an evaluation takes 100 s
        return 0.5

    curve = LearningCurve(evaluate=evaluate, every=2)
    state = SimpleNamespace(global_step=0, max_steps=3)
    curve.on_train_begin(None, state, None, model="m", processing_class="t")
    for step in (1, 2, 3):
        clock[0] += 5.0
        state.global_step = step
        curve.on_log(None, state, None, logs={"reward": step / 10}, model="m", processing_class="t")
    curve.on_log(None, state, None, logs={"train_runtime": 1.0})  # the end-of-training log: no reward, skipped
    assert [(p.step, p.seconds, p.reward, p.heldout) for p in curve.points] == [
        (1, 5.0, 0.1, None), (2, 10.0, 0.2, 0.5), (3, 15.0, pytest.approx(0.3), 0.5)]
    assert [(s, t) for s, t, _ in curve.heldout] == [(0, 0.0), (2, 10.0), (3, 15.0)]
    assert curve.evaluated_s == 200.0  # the one before training is not counted either
    with pytest.raises(ConfigurationError):
        LearningCurve(every=0)


def _run(schedule, seed, rewards, step_s, heldout=((0, 0.0, 0.1), (6, 12.0, 0.4))):
    return {"schedule": schedule, "seed": seed,
            "points": [{"step": i + 1, "seconds": step_s * (i + 1), "reward": r, "heldout": None}
                       for i, r in enumerate(rewards)], "heldout": [list(h) for h in heldout]}


def test_time_to_level_and_the_ratio_against_thundersync() -> None:
    rewards = [0.1, 0.1, 0.3, 0.5, 0.5, 0.6]
    assert time_to_level(_run("sync", 0, rewards, 2.0)["points"], 0.3, 2) == (8.0, 4)  # mean(0.3, 0.5) = 0.4
    runs = [_run("sync", 0, rewards, 2.0), _run("sync", 1, rewards, 3.0),
            _run("thundersync", 0, rewards, 1.0), _run("thundersync", 1, rewards, 1.5),
            _run("trl", 0, [0.1] * 6, 2.0)]
    result = analyse(runs, level=0.3, window=2)
    sync, ts, trl = (result["summary"][k] for k in ("sync", "thundersync", "trl"))
    assert sync["seconds_to_level"] == (pytest.approx(10.0), pytest.approx(2 ** 0.5 * 2))
    assert ts["seconds_to_level"][0] == pytest.approx(5.0) and sync["time_ratio_vs_thundersync"] == pytest.approx(2.0)
    assert sync["step_to_level"][0] == 4.0 and sync["step_time_ratio_vs_thundersync"] == pytest.approx(2.0)
    assert (trl["reached"], trl["seconds_to_level"], trl["time_ratio_vs_thundersync"]) == (0, None, None)
    row = result["rows"][0]
    assert (row["heldout_before"], row["heldout_after"], row["reward_last_mean"]) == (0.1, 0.4, pytest.approx(0.55))


def test_time_to_a_heldout_level_and_its_ratio() -> None:
    """The held-out level is read off the evaluations (step, seconds, score): the first one at or above it."""
    from benchmarks.time_to_quality import heldout_time_to_level

    held = ((0, 0.0, 0.1), (2, 4.0, 0.5), (4, 8.0, 0.9), (6, 12.0, 0.7))
    assert heldout_time_to_level([list(h) for h in held], 0.8) == (8.0, 4)
    assert heldout_time_to_level([list(h) for h in held], 0.95) is None
    slow = [(s, 2 * t, v) for s, t, v in held]
    runs = [_run("thundersync", 0, [0.5] * 6, 1.0, held), _run("sync", 0, [0.5] * 6, 2.0, slow),
            _run("trl", 0, [0.5] * 6, 2.0, ((0, 0.0, 0.1),))]
    summary = analyse(runs, level=0.3, window=2, heldout_level=0.8)["summary"]
    assert summary["thundersync"]["seconds_to_heldout"] == (8.0, 0.0)
    assert summary["sync"]["heldout_time_ratio_vs_thundersync"] == pytest.approx(2.0)
    assert summary["sync"]["heldout_time_ratio_per_seed"] == (pytest.approx(2.0), 0.0)
    assert (summary["trl"]["reached_heldout"], summary["trl"]["heldout_time_ratio_vs_thundersync"]) == (0, None)
    assert summary["trl"]["heldout_time_ratio_per_seed"] is None


def test_the_curve_can_follow_another_logged_metric() -> None:
    """A distillation run logs no reward: `metric` names the key to record (here OPD's reverse KL)."""
    curve = LearningCurve(metric="opd/reverse_kl")
    state = SimpleNamespace(global_step=1, max_steps=2)
    curve.on_train_begin(None, state, None)
    curve.on_log(None, state, None, logs={"loss": 0.3, "opd/reverse_kl": 0.25})
    curve.on_log(None, state, None, logs={"reward": 1.0})  # not the followed metric: skipped
    assert [(p.step, p.reward) for p in curve.points] == [(1, 0.25)]


def test_the_distillation_workload_follows_its_loss_and_times_only_the_held_out_level() -> None:
    """`--trainer gkd`: ThunderSyncGKDTrainer on the thermostat suite, sync against thundersync (no stock baseline:
    TRL's GKDTrainer runs no environments); its curve follows the logged loss, so the training-reward level is not
    timed, the held-out one is."""
    from benchmarks.time_to_quality import GKD_SCHEDULES, QualityWorkload, format_report

    w = QualityWorkload.for_suite("thermostat", "gkd", steps=4)
    assert (w.trainer, w.metric, w.steps, w.objective) == ("gkd", "loss", 4, "gjsd")
    assert QualityWorkload.for_suite("thermostat").metric == "reward"
    assert GKD_SCHEDULES == ("sync", "thundersync")
    with pytest.raises(SystemExit, match="thermostat"):
        QualityWorkload.for_suite("lookup", "gkd")
    held = ((0, 0.0, 0.2), (2, 5.0, 0.9))
    runs = [_run("thundersync", 0, [0.01, 0.001], 1.0, held),
            _run("sync", 0, [0.01, 0.001], 2.0, [(s, 2 * t, v) for s, t, v in held])]
    result = analyse(runs, level=None, window=2, heldout_level=0.8)
    assert result["rows"][0]["seconds_to_level"] is None and result["summary"]["thundersync"]["reached"] == 0
    assert result["summary"]["sync"]["heldout_time_ratio_vs_thundersync"] == pytest.approx(2.0)
    report = "\n".join(format_report({**result, "workload": w.to_dict()}))
    assert "loss step 1" in report and "| sync | 0/1 |" in report and "training reward" not in report


def test_the_per_seed_ratio_pairs_each_seed_with_thundersyncs_run_of_the_same_seed() -> None:
    """Seed 0: sync 3x slower than thundersync; seed 1: as fast. The ratio of mean times (6 / 4) differs from the
    mean of the per-seed ratios (2.0), whose spread is the one reported."""
    def held(t):
        return ((0, 0.0, 0.1), (2, t, 0.9))

    runs = [_run("thundersync", 0, [0.5], 1.0, held(2.0)), _run("sync", 0, [0.5], 1.0, held(6.0)),
            _run("thundersync", 1, [0.5], 1.0, held(6.0)), _run("sync", 1, [0.5], 1.0, held(6.0))]
    summary = analyse(runs, level=None, window=1, heldout_level=0.8)["summary"]
    assert summary["sync"]["heldout_time_ratio_vs_thundersync"] == pytest.approx(6.0 / 4.0)
    mean, sd = summary["sync"]["heldout_time_ratio_per_seed"]
    assert mean == pytest.approx(2.0) and sd == pytest.approx(2 ** 0.5)
    assert summary["thundersync"]["heldout_time_ratio_per_seed"] == (1.0, 0.0)
