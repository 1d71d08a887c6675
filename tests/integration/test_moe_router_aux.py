"""MoE policies: TRL 1.16's router load-balancing auxiliary loss, streamed exactly (issue 11 item 5).

A tiny Qwen3-MoE built offline declares `router_aux_loss_coef=0.001` in its config, so TRL enables the term on
default settings. Stock `trl.GRPOTrainer` and ThunderSync run on identical scripted rollouts (FP32); the batch
direction, the parameters after three steps, the `aux_loss` metric and the reported loss must agree. The term is
not separable per sequence (its expert counts are micro-batch totals), so the tests use several micro-batches:
a wrong partition changes the direction by ~2e-2 relative, a dropped term by ~5e-2 (coefficient 0.5).
"""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import MOE_PARITY_CASES, SHARED_PREFIX, load_model, relative_error, run_trainer
from tests.fixtures.tools import env_reward, replay_rollout_func
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

pytestmark = pytest.mark.slow
TOL = 1e-5

CASES = MOE_PARITY_CASES
# each also with the shared-prefix backward (full passes, logged, where it refuses the options)
RELEASES = {"reward": dict(release="reward"), "content_batch_scope": dict(release="content", reward_scope="batch"),
            "reward_shared_prefix": dict(release="reward", **SHARED_PREFIX),
            "content_batch_scope_shared_prefix": dict(release="content", reward_scope="batch", **SHARED_PREFIX)}


@pytest.fixture(scope="module")
def moe_model_path(tmp_path_factory):
    from trl_thundersync.tiny.moe import save_tiny_moe_model

    return str(save_tiny_moe_model(tmp_path_factory.mktemp("tiny-moe") / "tiny-qwen3-moe"))


@pytest.fixture(scope="module")
def moe_tokenizer(moe_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(moe_model_path)


def run(trainer_cls, config_cls, tmp_path, tokenizer, model_path, **overrides):
    return run_trainer(trainer_cls, config_cls, tmp_path / trainer_cls.__name__, tokenizer, model_path, **overrides)


def first_log(trainer) -> dict:
    return trainer.state.log_history[0]


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_direction_with_router_aux_loss_matches_trl(case, release, tmp_path, moe_tokenizer, moe_model_path):
    overrides = dict(CASES[case], max_steps=1, max_grad_norm=0.0)
    ref = run(GRPOTrainer, GRPOConfig, tmp_path, moe_tokenizer, moe_model_path, **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, moe_tokenizer, moe_model_path, **overrides,
              **RELEASES[release])
    assert ref.trainer.aux_loss_enabled and got.trainer.aux_loss_enabled
    work = got.trainer.last_batch[0].work
    assert sum(w.kind == "router_aux" for w in work) == got.trainer.args.steps_per_generation
    err = relative_error(got.directions[0], ref.directions[0])
    assert err <= TOL, f"{case}: relative error {err:.2e}"
    ref_log, got_log = first_log(ref.trainer), first_log(got.trainer)
    assert got_log["aux_loss"] == pytest.approx(ref_log["aux_loss"], rel=1e-6)
    assert got_log["loss"] == pytest.approx(ref_log["loss"], rel=1e-5, abs=1e-7)
    assert 0 < got_log["thundersync/stats_peak_mb"] <= got_log["thundersync/stats_bound_mb"]


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_parameters_after_three_steps_with_router_aux_loss_match_trl(release, tmp_path, moe_tokenizer,
                                                                      moe_model_path):
    overrides = dict(CASES["ga4_field_coef"], max_steps=3, max_grad_norm=0.5, optim="sgd", learning_rate=1e-2)
    ref = run(GRPOTrainer, GRPOConfig, tmp_path, moe_tokenizer, moe_model_path, **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, moe_tokenizer, moe_model_path, **overrides,
              **RELEASES[release])
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(moe_model_path).parameters()])
    assert (ref.params - initial).norm() > 0
    assert relative_error(got.params - initial, ref.params - initial) <= TOL
    assert len(got.directions) == len(ref.directions) == 3
    for a, b in zip(got.directions, ref.directions, strict=True):
        assert relative_error(a, b) <= TOL


def test_lora_adapter_with_router_aux_loss_matches_trl(tmp_path, moe_tokenizer, moe_model_path):
    """Only the adapter trains: the term reaches it through the hidden states the routers read."""
    from peft import LoraConfig

    overrides = dict(CASES["ga4_field_coef"], max_steps=1, max_grad_norm=0.0)
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    ref = run(GRPOTrainer, GRPOConfig, tmp_path, moe_tokenizer, moe_model_path, peft_config=LoraConfig(**lora),
              **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, moe_tokenizer, moe_model_path,
              peft_config=LoraConfig(**lora), **overrides)
    assert got.directions[0].numel() < 10_000  # the adapter, not the model
    assert relative_error(got.directions[0], ref.directions[0]) <= TOL


def test_zero_coefficient_turns_the_term_off_as_in_trl(tmp_path, moe_tokenizer, moe_model_path):
    overrides = dict(router_aux_loss_coef=0.0, max_steps=1, max_grad_norm=0.0)
    ref = run(GRPOTrainer, GRPOConfig, tmp_path, moe_tokenizer, moe_model_path, **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, moe_tokenizer, moe_model_path, **overrides)
    assert not got.trainer.aux_loss_enabled
    assert "aux_loss" not in first_log(got.trainer) and "aux_loss" not in first_log(ref.trainer)
    assert all(w.kind != "router_aux" for w in got.trainer.last_batch[0].work)
    assert relative_error(got.directions[0], ref.directions[0]) <= TOL


@pytest.mark.parametrize("release", ["reward", "content", "turn"])
def test_multi_turn_tool_training_with_router_aux_loss_matches_trl(release, tmp_path, moe_tokenizer, moe_model_path):
    """Agent trajectories (tool tokens attended, not scored) through every release point, vs TRL's rollout_func."""
    from benchmarks.parity import CaptureGrads, cpu_config
    from tests.fixtures.agentic_trainer import dataset, make_trainer

    trainer, capture, captured, _ = make_trainer(tmp_path / "ts", moe_tokenizer, moe_model_path,
                                                 delay=lambda i, t: 0.002 * ((7 * i + t) % 5), release=release,
                                                 router_aux_loss_coef=0.5, gradient_accumulation_steps=2,
                                                 per_device_train_batch_size=2)
    trainer.train()
    kinds = {w.kind for w in trainer.last_batch[0].work}
    assert "router_aux" in kinds and (release != "turn" or "turn" in kinds)
    rollout_func = replay_rollout_func(captured)

    ref_capture = CaptureGrads()
    args = cpu_config(GRPOConfig, tmp_path / "trl", max_steps=2, max_completion_length=256, optim="sgd",
                      router_aux_loss_coef=0.5, gradient_accumulation_steps=2, per_device_train_batch_size=2)
    ref = GRPOTrainer(model=load_model(moe_model_path), reward_funcs=[env_reward], args=args, train_dataset=dataset(),
                      processing_class=moe_tokenizer, rollout_func=rollout_func, callbacks=[ref_capture])
    ref.train()
    assert len(capture.directions) == len(ref_capture.directions) == 2
    for got, want in zip(capture.directions, ref_capture.directions, strict=True):
        assert relative_error(got, want) <= TOL
    aux = [h["aux_loss"] for h in trainer.state.log_history if "aux_loss" in h]
    ref_aux = [h["aux_loss"] for h in ref.state.log_history if "aux_loss" in h]
    assert aux == pytest.approx(ref_aux, rel=1e-6)


def test_two_processes_with_router_aux_loss_match_trl(tmp_path, moe_model_path):
    """DDP over gloo: each process's micro-batches carry their own term, averaged at the barrier as DDP averages."""
    from tests.fixtures.ddp_parity import run_ddp_parity

    ref, got = run_ddp_parity(tmp_path, moe_model_path, "moe_router_aux_ga2")
    assert len(ref["directions"]) == len(got["directions"]) == 2
    for a, b in zip(got["directions"], ref["directions"], strict=True):
        assert relative_error(a, b) <= TOL
    assert relative_error(got["params"], ref["params"]) <= TOL
