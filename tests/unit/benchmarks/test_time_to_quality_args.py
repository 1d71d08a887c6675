"""`python -m benchmarks.time_to_quality --rollout-engine`: the ThunderSync runs' engine reaches their configs (no
run is started here)."""

from __future__ import annotations

import pytest

from benchmarks import time_to_quality


@pytest.mark.parametrize("trainer", ["grpo", "gkd"])
def test_the_rollout_engine_reaches_the_thundersync_configs(monkeypatch, tmp_path, trainer):
    captured = {}

    class Recorder:
        def __init__(self, *args, **kwargs):
            captured.update(kwargs)

    import trl_thundersync.trainers.gkd.trainer as gkd
    import trl_thundersync.trainers.grpo.trainer as grpo
    from benchmarks import parity

    monkeypatch.setattr(grpo, "ThunderSyncGRPOTrainer", Recorder)
    monkeypatch.setattr(gkd, "ThunderSyncGKDTrainer", Recorder)
    monkeypatch.setattr(parity, "load_model", lambda path: None)
    assert time_to_quality.parse_args([]).rollout_engine is None  # default: the workload's embedded_server
    workload = time_to_quality.QualityWorkload.for_suite("thermostat", trainer, rollout_engine="managed_vllm")
    time_to_quality.build("thundersync", workload, 0, "model", tmp_path, curve=None, teacher_dir="teacher")
    assert captured["args"].rollout_engine == "managed_vllm" and captured["args"].schedule == "thundersync"
    assert time_to_quality.QualityWorkload().rollout_engine == "embedded_server"
    assert time_to_quality.parse_args(["--rollout-engine", "managed_vllm"]).rollout_engine == "managed_vllm"
