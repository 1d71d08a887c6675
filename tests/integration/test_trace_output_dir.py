"""Two trainers and one output_dir: at the same time refused (TraceInUseError), one after the other fine."""

from __future__ import annotations

import pytest

from benchmarks.parity import cpu_config, load_model, prompt_dataset, reward_len, scripted_rollout_func
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.errors import TraceInUseError
from trl_thundersync.trace.export import read_jsonl
from trl_thundersync.trace.recorder import TRACE_FILE

pytestmark = pytest.mark.slow


def make(out, tokenizer, path, max_steps):
    args = cpu_config(ThunderSyncGRPOConfig, out, max_steps=max_steps)
    return ThunderSyncGRPOTrainer(model=load_model(path), reward_funcs=[reward_len], args=args,
                                  train_dataset=prompt_dataset(), processing_class=tokenizer,
                                  rollout_func=scripted_rollout_func(tokenizer))


def test_runs_sharing_output_dir(tmp_path, tokenizer, tiny_model_path):
    first = make(tmp_path, tokenizer, tiny_model_path, max_steps=2)
    second = make(tmp_path, tokenizer, tiny_model_path, max_steps=1)
    seen = {}

    original = first._barrier

    def step_then_try_the_other(totals, timing, normalization, buckets, scored, prompts, *batch):
        if "error" not in seen:  # while the first run is live, the second cannot start
            with pytest.raises(TraceInUseError, match=f"output_dir={str(tmp_path)!r}") as caught:
                second.train()
            seen["error"] = caught.value
        return original(totals, timing, normalization, buckets, scored, prompts, *batch)

    first._barrier = step_then_try_the_other
    first.train()
    assert "error" in seen and second.state.global_step == 0
    assert [s.step for s in read_jsonl(tmp_path / TRACE_FILE)] == [0, 1]  # nothing interleaved
    second.train()  # the first run finished: the output_dir is free, and its trace is the new run's
    assert [s.step for s in read_jsonl(tmp_path / TRACE_FILE)] == [0]
