"""The timing-stress plugin (`tests/fixtures/timing_stress.py`) patches what it says and nothing else: under "late"
the GRPO and distillation pipelines drain through one delayed `drain`; under "slow" each learner input is delayed;
both call the original afterwards; an unknown mode is refused."""

from __future__ import annotations

import pytest

from tests.fixtures import timing_stress
from trl_thundersync.distill import pipeline as distill_pipeline
from trl_thundersync.streaming import learner as learner_module
from trl_thundersync.streaming import pipeline as grpo_pipeline


@pytest.fixture
def restored(monkeypatch):
    """Whatever `apply` patches is put back after the test (monkeypatch records each original)."""
    monkeypatch.setattr(grpo_pipeline, "drain", grpo_pipeline.drain)
    monkeypatch.setattr(distill_pipeline, "drain", distill_pipeline.drain)
    for name in timing_stress.SLOWED:
        monkeypatch.setattr(learner_module.GRPOBatchLearner, name, getattr(learner_module.GRPOBatchLearner, name))
    sleeps: list[float] = []
    monkeypatch.setattr(timing_stress, "sleep", sleeps.append)  # (this module's name only: nothing sleeps)
    return sleeps


def test_late_delays_both_pipelines_drain_once_then_drains(restored):
    original = grpo_pipeline.drain
    calls = []
    grpo_pipeline.drain = lambda *args, **kwargs: calls.append(args) or "drained"
    timing_stress.apply("late")
    timing_stress.apply("late")  # idempotent: still one delay per call
    assert distill_pipeline.drain is grpo_pipeline.drain and grpo_pipeline.drain is not original
    assert grpo_pipeline.drain("inbox") == "drained" and calls == [("inbox",)]
    assert restored == [timing_stress.LATE_SECONDS]


def test_slow_delays_every_learner_input_then_runs_it(restored):
    cls = learner_module.GRPOBatchLearner
    seen = []
    for name in timing_stress.SLOWED:
        setattr(cls, name, lambda self, *args, _name=name: seen.append(_name))
    timing_stress.apply("slow")
    timing_stress.apply("slow")
    for name in timing_stress.SLOWED:
        getattr(cls, name)(object.__new__(cls), "item")
    assert seen == list(timing_stress.SLOWED)
    assert restored == [timing_stress.SLOW_SECONDS] * len(timing_stress.SLOWED)


def test_an_unknown_mode_is_refused(restored):
    with pytest.raises(ValueError, match="THUNDERSYNC_TIMING_STRESS='fast' is not one of"):
        timing_stress.apply("fast")
