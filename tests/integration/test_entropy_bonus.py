"""TRL 1.16's entropy bonus (`entropy_coef`, `use_adaptive_entropy`), streamed exactly (issue 11).

TRL subtracts `coef · Σ_t m H / max(N_b, 1) / GA` in every micro-batch b: a token mean over the micro-batch, whatever
the loss type. ThunderSync computes E_i = ∇ Σ_t m_it (−coef) H_it per trajectory (advantage-free, like β·KL),
adds it into its TRL micro-batch's buffer and scales each buffer by 1/(max(N_b, 1)·GA) at the barrier. Stock
`trl.GRPOTrainer` and ThunderSync run on identical scripted rollouts (FP32); the batch direction, the reported loss,
the `entropy` / `policy_loss` / `entropy_coef` metrics and (adaptive entropy) the coefficient trajectory must agree.
"""

from __future__ import annotations

import json

import pytest
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import ENTROPY_PARITY_CASES, SHARED_PREFIX, cpu_config, relative_error, run_trainer
from tests.fixtures.floors import assert_within_floor, grpo_floor_runs
from tests.fixtures.tools import env_reward, replay_rollout_func
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.errors import ConfigurationError

pytestmark = pytest.mark.slow
TOL = 1e-5

CASES = ENTROPY_PARITY_CASES
RELEASES = {"reward": dict(release="reward"), "content_batch_scope": dict(release="content", reward_scope="batch"),
            # one buffer slot: most trajectories are released at their reward, their E_i with them (once each)
            "content_one_slot": dict(release="content", max_buffered_trajectories=1),
            # the shared-prefix backward: the entropy adjoints summed per TRL micro-batch, one prefix backward each
            "reward_shared_prefix": dict(release="reward", **SHARED_PREFIX),
            "content_one_slot_shared_prefix": dict(release="content", max_buffered_trajectories=1, **SHARED_PREFIX)}


def run(trainer_cls, config_cls, tmp_path, tokenizer, model_path, **overrides):
    return run_trainer(trainer_cls, config_cls, tmp_path / trainer_cls.__name__, tokenizer, model_path, **overrides)


def logged(trainer, key) -> list:
    return [h[key] for h in trainer.state.log_history if key in h and "train_runtime" not in h]


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_direction_with_entropy_bonus_matches_trl(case, release, tmp_path, tokenizer, tiny_model_path):
    overrides = dict(CASES[case], max_steps=1, max_grad_norm=0.0)
    ref = run(GRPOTrainer, GRPOConfig, tmp_path, tokenizer, tiny_model_path, **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path, **overrides,
              **RELEASES[release])
    err = relative_error(got.directions[0], ref.directions[0])
    assert err <= TOL, f"{case}: relative error {err:.2e}"
    ref_log, got_log = ref.trainer.state.log_history[0], got.trainer.state.log_history[0]
    assert got_log["loss"] == pytest.approx(ref_log["loss"], rel=1e-5, abs=1e-7)
    for key in ("entropy", "policy_loss"):
        assert got_log[key] == pytest.approx(ref_log[key], rel=1e-5, abs=1e-7), key
    assert got_log["entropy_coef"] == ref_log["entropy_coef"] == CASES[case]["entropy_coef"]
    assert 0 < got_log["thundersync/stats_peak_mb"] <= got_log["thundersync/stats_bound_mb"]


def test_lora_adapter_with_entropy_bonus_matches_trl(tmp_path, tokenizer, tiny_model_path):
    from peft import LoraConfig

    overrides = dict(CASES["ga2_coef_0.5_grpo_beta"], max_steps=1, max_grad_norm=0.0)
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    ref = run(GRPOTrainer, GRPOConfig, tmp_path, tokenizer, tiny_model_path, peft_config=LoraConfig(**lora),
              **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path,
              peft_config=LoraConfig(**lora), **overrides)
    assert got.directions[0].numel() < 10_000  # the adapter, not the model
    assert relative_error(got.directions[0], ref.directions[0]) <= TOL


def test_entropy_bonus_changes_the_direction_and_a_global_normalizer_is_caught(tmp_path, tokenizer, tiny_model_path,
                                                                                monkeypatch):
    """The bonus is visible in the direction, and normalizing it by the batch's tokens instead of each micro-batch's
    (a plausible wrong implementation) fails the tolerance by orders of magnitude (measured: the bonus moves the
    direction by 4.0e-3 relative, the global normalizer misses by 4.0e-3; with ga2_coef_0.5_dapo, 9.2e-3 and
    3.8e-4)."""
    import trl_thundersync.trainers.grpo.entropy as module

    overrides = dict(CASES["ga4_coef_0.5_mask_truncated"], max_steps=1, max_grad_norm=0.0)
    ref = run(GRPOTrainer, GRPOConfig, tmp_path / "ref", tokenizer, tiny_model_path, **overrides)
    without = run(GRPOTrainer, GRPOConfig, tmp_path / "off", tokenizer, tiny_model_path,
                  **dict(overrides, entropy_coef=0.0))
    assert relative_error(without.directions[0], ref.directions[0]) > 1e-3

    def global_scales(tokens_per_micro_batch, micro_batches):
        total = sum(tokens_per_micro_batch.values())
        return {b: 1.0 / max(total, 1) for b in tokens_per_micro_batch}  # Σ_b S_b / N: a window-global mean

    monkeypatch.setattr(module, "entropy_scales", global_scales)
    wrong = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "wrong", tokenizer, tiny_model_path,
                **overrides)
    assert relative_error(wrong.directions[0], ref.directions[0]) > 100 * TOL


@pytest.mark.exactness
def test_permuted_floor_and_parameters_after_three_steps_match_trl(tmp_path, tokenizer, tiny_model_path):
    """SGD over three steps with clipping; every step's direction within TOL or twice TRL's own floor (its members
    permuted, its batch padded: `tests/fixtures/floors.py`)."""
    overrides = dict(CASES["ga2_coef_0.5_grpo_beta"], max_steps=3, max_grad_norm=0.5, optim="sgd")
    ref = run(GRPOTrainer, GRPOConfig, tmp_path / "ref", tokenizer, tiny_model_path, **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "ts", tokenizer, tiny_model_path,
              **overrides)
    floor_runs = grpo_floor_runs(tmp_path, tokenizer, tiny_model_path, **overrides)
    assert len(got.directions) == len(ref.directions) == 3
    for step, (a, b) in enumerate(zip(got.directions, ref.directions, strict=True)):
        assert_within_floor(relative_error(a, b),
                            {name: (lambda run=run, k=step: relative_error(run().directions[k], ref.directions[k]))
                             for name, run in floor_runs.items()}, at_least=TOL, what=f"step {step + 1}")
    assert relative_error(got.params, ref.params) <= TOL


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("target", [100.0, 1.0])  # entropy (≈6 nats) below the target: the bonus engages; above: not
def test_adaptive_entropy_coefficient_trajectory_matches_trl(target, release, tmp_path, tokenizer, tiny_model_path):
    overrides = dict(use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.15, entropy_coef_max=0.4,
                     entropy_coef_min=0.0, entropy_target=target, gradient_accumulation_steps=2,
                     per_device_train_batch_size=2, max_steps=3, max_grad_norm=0.0, optim="sgd")
    ref = run(GRPOTrainer, GRPOConfig, tmp_path, tokenizer, tiny_model_path, **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path, **overrides,
              **RELEASES[release])
    coefs = logged(got.trainer, "entropy_coef")
    assert coefs == pytest.approx(logged(ref.trainer, "entropy_coef"), abs=1e-12)
    assert coefs == pytest.approx([0.25, 0.4, 0.4] if target > 10 else [0.0, 0.0, 0.0], abs=1e-12)
    assert got.trainer.entropy_coef == pytest.approx(ref.trainer.entropy_coef, abs=1e-12)
    assert got.trainer._last_world_entropy == pytest.approx(ref.trainer._last_world_entropy, rel=1e-6)
    for a, b in zip(got.directions, ref.directions, strict=True):
        assert relative_error(a, b) <= TOL
    assert logged(got.trainer, "entropy") == pytest.approx(logged(ref.trainer, "entropy"), rel=1e-5)
    assert logged(got.trainer, "loss") == pytest.approx(logged(ref.trainer, "loss"), rel=1e-5, abs=1e-7)


def test_adaptive_entropy_state_is_saved_and_restored_with_checkpoints(tmp_path, tokenizer, tiny_model_path):
    """TRL's `_save_checkpoint` / `_load_optimizer_and_scheduler` hooks run for ThunderSync's trainer too."""
    overrides = dict(use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.15, entropy_target=100.0,
                     max_steps=2, save_strategy="steps", save_steps=1, optim="sgd")
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path, **overrides)
    out = tmp_path / ThunderSyncGRPOTrainer.__name__
    state = json.loads((out / "checkpoint-1" / "entropy_ctrl_state.json").read_text())
    assert state["entropy_coef"] == pytest.approx(0.25)
    final = json.loads((out / "checkpoint-2" / "entropy_ctrl_state.json").read_text())
    assert final == {"entropy_coef": got.trainer.entropy_coef, "last_world_entropy": got.trainer._last_world_entropy}
    resumed = ThunderSyncGRPOTrainer(model=got.trainer.model, reward_funcs=got.trainer.reward_funcs,
                                     args=cpu_config(ThunderSyncGRPOConfig, tmp_path / "resumed", **overrides),
                                     train_dataset=got.trainer.train_dataset, processing_class=tokenizer)
    assert resumed.entropy_coef == 0.1 and resumed._last_world_entropy == float("inf")
    resumed.create_optimizer_and_scheduler(num_training_steps=2)
    resumed._load_optimizer_and_scheduler(str(out / "checkpoint-1"))
    assert resumed.entropy_coef == pytest.approx(0.25)
    assert resumed._last_world_entropy == pytest.approx(state["last_world_entropy"])
    resumed.close()


def test_entropy_options_are_accepted_and_top_entropy_quantile_stays_refused(tmp_path):
    config = cpu_config(ThunderSyncGRPOConfig, tmp_path, entropy_coef=0.01, use_adaptive_entropy=True)
    assert config.entropy_coef == 0.01 and config.use_adaptive_entropy
    with pytest.raises(ConfigurationError, match="top_entropy_quantile=0.5"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, entropy_coef=0.01, top_entropy_quantile=0.5)


@pytest.mark.parametrize("release", ["reward", "content", "turn"])
def test_multi_turn_tool_training_with_entropy_bonus_matches_trl(release, tmp_path, tokenizer, tiny_model_path):
    """Agent trajectories (tool tokens neither scored nor in N_b) through every release point, vs TRL's rollout_func
    on the same tokens; under release="turn" the bonus is one more per-turn channel of the boundary-cut backward."""
    from benchmarks.parity import CaptureGrads, load_model
    from tests.fixtures.agentic_trainer import dataset, make_trainer

    options = dict(entropy_coef=0.5, gradient_accumulation_steps=2, per_device_train_batch_size=2, beta=0.1,
                   loss_type="grpo")
    trainer, capture, captured, _ = make_trainer(tmp_path / "ts", tokenizer, tiny_model_path,
                                                 delay=lambda i, t: 0.002 * ((7 * i + t) % 5), release=release,
                                                 **options)
    trainer.train()
    totals = trainer.last_batch[0]
    kinds = {w.kind for w in totals.work}
    assert release != "turn" or ("turn" in kinds and totals.turn_fallbacks == 0)
    rollout_func = replay_rollout_func(captured)

    ref_capture = CaptureGrads()
    args = cpu_config(GRPOConfig, tmp_path / "trl", max_steps=2, max_completion_length=256, optim="sgd", **options)
    ref = GRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[env_reward], args=args,
                      train_dataset=dataset(), processing_class=tokenizer, rollout_func=rollout_func,
                      callbacks=[ref_capture])
    ref.train()
    assert len(capture.directions) == len(ref_capture.directions) == 2
    for got, want in zip(capture.directions, ref_capture.directions, strict=True):
        assert relative_error(got, want) <= TOL
    assert logged(trainer, "entropy") == pytest.approx(logged(ref, "entropy"), rel=1e-5)
    got_log = trainer.state.log_history[-2]
    if release != "turn":  # under "turn" the peak also holds the retained per-turn graphs, outside the P-vector bound
        assert 0 < got_log["thundersync/stats_peak_mb"] <= got_log["thundersync/stats_bound_mb"]


def test_two_processes_with_adaptive_entropy_match_trl(tmp_path, tiny_model_path):
    """DDP over gloo: each process normalizes its own micro-batches, the controller's window is global over ranks.
    Step 1 applies coefficient 0 (no window yet), step 2 the updated 0.25."""
    from tests.fixtures.ddp_parity import run_ddp_parity

    ref, got = run_ddp_parity(tmp_path, tiny_model_path, "entropy_adaptive_ga2")
    assert len(ref["directions"]) == len(got["directions"]) == 2
    for a, b in zip(got["directions"], ref["directions"], strict=True):
        assert relative_error(a, b) <= TOL
    assert relative_error(got["params"], ref["params"]) <= TOL


def test_resuming_from_a_checkpoint_continues_the_adaptive_coefficient(tmp_path, tokenizer, tiny_model_path):
    """`train(resume_from_checkpoint=...)` restores the controller: the resumed step applies the saved coefficient."""
    from benchmarks.parity import CaptureGrads, load_model, prompt_dataset, reward_len, scripted_rollout_func

    overrides = dict(use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.15, entropy_coef_max=0.4,
                     entropy_target=100.0, max_steps=3, save_strategy="steps", save_steps=1, optim="sgd",
                     max_grad_norm=0.0)

    def trainer(out):
        capture = CaptureGrads()
        t = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len],
                                   args=cpu_config(ThunderSyncGRPOConfig, out, **overrides),
                                   train_dataset=prompt_dataset(), processing_class=tokenizer,
                                   rollout_func=scripted_rollout_func(tokenizer), callbacks=[capture])
        return t, capture

    whole, whole_capture = trainer(tmp_path / "whole")
    whole.train()
    resumed, resumed_capture = trainer(tmp_path / "whole")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    assert logged(whole, "entropy_coef") == pytest.approx([0.25, 0.4, 0.4])
    assert resumed.entropy_coef == pytest.approx(whole.entropy_coef)
    assert resumed._last_world_entropy == pytest.approx(whole._last_world_entropy, rel=1e-6)
    assert len(resumed_capture.directions) == 1
    assert relative_error(resumed_capture.directions[0], whole_capture.directions[2]) <= TOL
