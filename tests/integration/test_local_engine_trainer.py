"""The default path: ThunderSyncGRPOTrainer with its default rollout engine (embedded HTTP servers started for the run,
driven by the vLLM client), and the in-process LocalProcessEngine where its deterministic arrival order matters."""

from __future__ import annotations

import pytest
import torch

from benchmarks.parity import StopAt, cpu_config, load_model, prompt_dataset, relative_error
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

pytestmark = pytest.mark.slow


def reward_digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) - len(c) / 16 for c in completions]



def train(path, tokenizer, out, callbacks=(), resume=None, **overrides):
    common = dict(max_completion_length=12, per_device_train_batch_size=8, num_generations=4, max_steps=3,
                  optim="sgd", learning_rate=0.05, rollout_max_in_flight=4)
    common.update(overrides)
    trainer = ThunderSyncGRPOTrainer(model=load_model(path), reward_funcs=[reward_digits],
                                     args=cpu_config(ThunderSyncGRPOConfig, out, **common),
                                     train_dataset=prompt_dataset(16), eval_dataset=prompt_dataset(4),
                                     processing_class=tokenizer, callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])


@pytest.mark.parametrize("engine", ["local_process", "auto"])
def test_schedules_sample_the_same_trajectories_and_reach_the_same_parameters(tmp_path, tokenizer, tiny_model_path,
                                                                               engine):
    # one pass per member on both sides (the sync schedule would batch each group: the same up to rounding, not bits)
    common = dict(rollout_engine=engine, batch_group_members=False)
    ts, ts_params = train(tiny_model_path, tokenizer, tmp_path / "ts", schedule="thundersync", **common)
    sync, sync_params = train(tiny_model_path, tokenizer, tmp_path / "sync", schedule="sync", **common)
    if engine == "local_process":  # one worker, deterministic arrival order: bit-identical
        assert torch.equal(ts_params, sync_params)
    else:  # HTTP arrival order varies from run to run: same trajectories, group sums equal up to FP32 rounding
        assert relative_error(ts_params, sync_params) <= 1e-6
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(tiny_model_path).parameters()])
    assert not torch.equal(ts_params, initial)
    assert ts.policy_version == sync.policy_version == 3
    order = ts.last_batch[1].arrival_order
    assert sorted(order) == list(range(8))


@pytest.mark.parametrize("release, kind", [("reward", "trajectory"), ("content", "content")])
def test_trajectories_arrive_in_completion_order(release, kind, tmp_path, tokenizer, tiny_model_path):
    # (batch_group_members=False: every source its own item; the tail's batched groups are tested in test_prefix_batch)
    trainer, _ = train(tiny_model_path, tokenizer, tmp_path, max_steps=1, rollout_max_in_flight=8,
                       max_completion_length=24, release=release, batch_group_members=False)
    totals, timing = trainer.last_batch
    work = [w for w in totals.work if w.kind == kind]
    assert [w.index for w in work] == list(timing.arrival_order)
    # each source was served after its inputs were fixed: its reward (reward release) or its tokens (content)
    assert all(w.start >= w.ready for w in work)
    if release == "content":
        assert all(w.ready == w.content_ready and w.content_ready <= w.reward_at for w in work)


def test_resume_with_the_embedded_engine(tmp_path, tokenizer, tiny_model_path):
    common = dict(max_steps=4, save_strategy="steps", save_steps=2)
    _, straight = train(tiny_model_path, tokenizer, tmp_path / "straight", **common)
    train(tiny_model_path, tokenizer, tmp_path / "resumed", callbacks=[StopAt(2)], **common)
    resumed_trainer, resumed = train(tiny_model_path, tokenizer, tmp_path / "resumed",
                                     resume=str(tmp_path / "resumed" / "checkpoint-2"), **common)
    assert resumed_trainer.state.global_step == 4
    assert relative_error(resumed, straight) <= 1e-6


def test_evaluation_runs_beside_streamed_training(tmp_path, tokenizer, tiny_model_path):
    trainer, _ = train(tiny_model_path, tokenizer, tmp_path, max_steps=2, eval_strategy="steps", eval_steps=1,
                       per_device_eval_batch_size=4)
    evals = [h for h in trainer.state.log_history if "eval_reward" in h]
    assert len(evals) == 2 and all(h["eval_completions/mean_length"] > 0 for h in evals)
