"""The memory plan inside a GRPO run: caps chosen from `memory_budget` stream the same update as stock TRL down to
one open group, the plan and the measured peak are logged, a run that cannot fit is refused before its first rollout,
and a model whose trainable parameters changed after the plan is refused before its first optimizer step."""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

import trl_thundersync.trainers.grpo.memory as grpo_memory
from benchmarks.parity import (
    cpu_config,
    load_model,
    prompt_dataset,
    relative_error,
    reward_len,
    run_trainer,
    scripted_rollout_func,
)
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.errors import MemoryPlanError
from trl_thundersync.memory.available import pending_bytes

pytestmark = [pytest.mark.slow, pytest.mark.exactness]
TOL = 1e-5
TWO_GROUPS = dict(per_device_train_batch_size=8, num_generations=4, max_steps=1, max_grad_norm=0.0)


def trainable(model_path) -> int:
    return sum(p.numel() for p in load_model(model_path).parameters())


@pytest.mark.parametrize("buffers, release", [(1, "content"), (0, "reward")])
def test_the_smallest_budgets_stream_stock_trls_update(buffers, release, tmp_path, tokenizer, tiny_model_path):
    """One open group of two (4·3·P bytes: the batch accumulator, G1, G2), plus one release buffer (4·P) or none
    (content release falls back to reward release): the caps the budget chose are in effect, and the batch direction
    is TRL's."""
    budget = 4 * 3 * trainable(tiny_model_path) + 4 * trainable(tiny_model_path) * buffers
    ref = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, tiny_model_path, **TWO_GROUPS)
    got = run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "ts", tokenizer, tiny_model_path,
                      memory_budget=budget, **TWO_GROUPS)
    args = got.trainer.args
    assert (args.max_open_groups, args.max_buffered_trajectories, args.release) == (1, buffers or None, release)
    assert relative_error(got.directions[0], ref.directions[0]) <= TOL
    log = got.trainer.state.log_history[0]
    assert log["thundersync/stats_peak_mb"] <= log["thundersync/memory_plan_mb"]
    assert log["thundersync/peak_memory_mb"] > 0 and log.get("thundersync/buffered_peak", 0) <= buffers
    assert got.trainer.memory_plan.total("thundersync") == pytest.approx(log["thundersync/memory_plan_mb"] * 2**20)
    trace = got.trainer.last_trace  # the step trace records both too
    assert trace.plan_bytes == got.trainer.memory_plan.total("thundersync") and trace.peak_memory_bytes > 0
    planned = {line.name: line.bytes for line in got.trainer.memory_plan.lines}
    assert planned["framework"] > 0 and planned["activations"] > 0  # measured before training; the passes


def test_a_run_that_cannot_fit_is_refused_before_its_first_rollout(tmp_path, tokenizer, tiny_model_path,
                                                                    monkeypatch):
    calls = []
    fitted = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len],
                                    args=cpu_config(ThunderSyncGRPOConfig, tmp_path, **TWO_GROUPS),
                                    train_dataset=prompt_dataset(), processing_class=tokenizer,
                                    rollout_func=scripted_rollout_func(tokenizer, calls=calls))
    trl_needs = pending_bytes(fitted.memory_plan, "trl")  # what stock TRL still allocates: it would fit
    monkeypatch.setattr(grpo_memory, "free_bytes", lambda device: trl_needs)
    with pytest.raises(MemoryPlanError, match=r"the memory plan needs \S+ MB more on cpu \(optimizer state .*group "
                                              r"statistics .*set memory_budget \(or lower max_open_groups"):
        ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len],
                               args=cpu_config(ThunderSyncGRPOConfig, tmp_path, **TWO_GROUPS),
                               train_dataset=prompt_dataset(), processing_class=tokenizer,
                               rollout_func=scripted_rollout_func(tokenizer, calls=calls))
    assert calls == []


def test_trainable_parameters_changed_after_the_plan_are_refused_before_any_step(tmp_path, tokenizer,
                                                                                  tiny_model_path):
    calls = []
    trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len],
                                     args=cpu_config(ThunderSyncGRPOConfig, tmp_path, **TWO_GROUPS),
                                     train_dataset=prompt_dataset(), processing_class=tokenizer,
                                     rollout_func=scripted_rollout_func(tokenizer, calls=calls))
    trainer.model.get_input_embeddings().weight.requires_grad_(False)  # frozen after the plan
    before = torch.cat([p.detach().reshape(-1).clone() for p in trainer.model.parameters()])
    with pytest.raises(MemoryPlanError, match=r"trainable parameters, the memory plan was made for 106,944"):
        trainer.train()
    assert calls == [] and trainer.state.global_step == 0
    assert torch.equal(before, torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()]))
