"""The lifecycle both trainers share (`trainers/lifecycle.py`): publication, the step record and trace, close."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest

from trl_thundersync.trace.records import StepTrace
from trl_thundersync.trainers.gkd import trainer as gkd_trainer
from trl_thundersync.trainers.grpo import trainer as grpo_trainer
from trl_thundersync.trainers.lifecycle import (
    PublishCallback,
    StepRecord,
    StreamingLifecycle,
    step_timing_metrics,
    trajectory_seed,
)


class Engine:
    def __init__(self):
        self.published, self.closed = [], False

    def publish(self, model, version):
        self.published.append((model, version))
        return 0.25

    def close(self):
        self.closed = True


class Writer:
    def __init__(self):
        self.traces, self.closed = [], False

    def append(self, trace):
        self.traces.append(trace)

    def close(self):
        self.closed = True


class Trainer(StreamingLifecycle):
    def __init__(self, due=True):
        self.model = "model"
        self.accelerator = SimpleNamespace(unwrap_model=lambda m: f"unwrapped {m}", num_processes=1)
        self._metrics = {"train": defaultdict(list)}
        self._engine, self._trace_writer, self.policy_version, self.due = Engine(), Writer(), 0, due
        self.traced: list = []

    def _publish_due(self, global_step):
        return self.due

    def _step_trace(self, step, optimizer_end, publish_end):
        self.traced.append(step)
        return StepTrace(step=step.version, schedule="sync", start=step.timing.start,
                         rollout_end=step.timing.rollout_end, learner_end=step.timing.barrier,
                         barrier_end=optimizer_end, publish_end=publish_end, events=())


def timing(start=1.0, rollout_end=3.0, barrier=5.0, busy=2.0, turns_released=None, learner_cpu=None):
    return SimpleNamespace(start=start, rollout_end=rollout_end, barrier=barrier, learner_busy=busy,
                           tail=max(0.0, barrier - rollout_end), turns_released=turns_released,
                           learner_cpu=learner_cpu)


def test_publish_then_record_closes_the_open_step_once():
    trainer = Trainer()
    trainer._open_step = StepRecord(0, "totals", timing(), ["item"])
    callback = PublishCallback(trainer)
    callback.on_step_end(None, SimpleNamespace(global_step=1), None)
    assert trainer._engine.published == [("unwrapped model", 1)] and trainer.policy_version == 1
    assert trainer._metrics["train"]["thundersync/publish_seconds"] == [0.25]
    assert trainer._open_step is None and len(trainer.traced) == 1 and len(trainer._trace_writer.traces) == 1
    assert trainer.last_trace is trainer._trace_writer.traces[0]
    assert len(trainer._metrics["train"]["thundersync/step_wall_with_publish_seconds"]) == 1
    assert trainer._metrics["train"]["thundersync/learner_tflops_per_s"] == [0.0]  # no learner events, no FLOPs
    callback.on_step_end(None, SimpleNamespace(global_step=2), None)  # nothing open: published, nothing traced
    assert len(trainer.traced) == 1 and trainer.policy_version == 2


def test_no_publish_between_passes_and_close_releases_engine_and_trace():
    trainer = Trainer(due=False)
    trainer._open_step = StepRecord(0, "totals", timing(), [])
    PublishCallback(trainer).on_step_end(None, SimpleNamespace(global_step=1), None)
    assert trainer._engine.published == [] and trainer.policy_version == 0 and len(trainer.traced) == 1
    engine, writer = trainer._engine, trainer._trace_writer
    trainer.close()
    assert engine.closed and writer.closed and trainer._engine is None and trainer._trace_writer is None
    trainer.close()  # idempotent


def test_step_record_is_an_immutable_indexable_record_and_timing_metrics():
    record = StepRecord(3, "totals", "timing", ["a"])
    assert record[3] == ["a"] and record.items == ["a"] and record.version == 3
    with pytest.raises(AttributeError):
        record.version = 4
    metrics = step_timing_metrics(timing())
    assert metrics == {"thundersync/step_wall_seconds": 4.0, "thundersync/rollout_seconds": 2.0,
                       "thundersync/learner_busy_seconds": 2.0, "thundersync/learner_tail_seconds": 2.0,
                       "thundersync/learner_idle_fraction": 0.5}
    assert step_timing_metrics(timing(start=5.0))["thundersync/learner_idle_fraction"] == 0.0
    # turn release: whether the step learned turns as they ended (`adaptive_turn_release`)
    assert step_timing_metrics(timing(turns_released=True))["thundersync/turns_released"] == 1.0
    assert step_timing_metrics(timing(turns_released=False))["thundersync/turns_released"] == 0.0
    # the learner thread's CPU, logged where the pipeline measured it
    assert step_timing_metrics(timing(learner_cpu=1.5))["thundersync/learner_cpu_seconds"] == 1.5


def test_both_trainers_share_the_lifecycle_and_grpo_re_exports_the_seed():
    for cls in (grpo_trainer.ThunderSyncGRPOTrainer, gkd_trainer.ThunderSyncGKDTrainer):
        assert issubclass(cls, StreamingLifecycle)
        assert cls.train is StreamingLifecycle.train and cls._publish is StreamingLifecycle._publish
    assert grpo_trainer.trajectory_seed is trajectory_seed


def test_the_grpo_helpers_take_records_and_callables_not_the_trainer():
    """Beside `trainer.py`, no GRPO module has a function parameter named `trainer`: they read `GRPOSettings` and the
    callables handed to them (issue 27)."""
    import ast
    from pathlib import Path

    folder = Path(grpo_trainer.__file__).parent
    helpers = [p for p in folder.glob("*.py") if p.name not in ("trainer.py", "__init__.py")]
    assert {p.name for p in helpers} >= {"backward.py", "entropy.py", "iterations.py", "metrics.py", "settings.py"}
    for path in helpers:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
                assert "trainer" not in names, (path.name, node.name)


def test_no_trainer_module_imports_the_other_trainers_modules():
    """GRPO's modules and GKD's share only `lifecycle`, `rollout_setup` and the config helpers."""
    import ast
    from pathlib import Path

    trainers = Path(grpo_trainer.__file__).parent.parent
    paths = [*trainers.glob("grpo/*.py"), *trainers.glob("gkd/*.py")]
    assert {p.name for p in paths} >= {"__init__.py", "trainer.py", "config.py"}
    for path in paths:
        other = "gkd" if path.parent.name == "grpo" else "grpo"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
                assert not any(other in n.split(".") for n in names), (path.name, names)
