"""The logged `loss` (and `policy_loss` with the entropy bonus) of a ThunderSync step is stock `trl.GRPOTrainer`'s.

At ratio 1 TRL's per-token policy loss is −A·g·h·c: h = log π(o_t) for cispo (g = min(1, ε_high)) and vespo (φ = 1),
h = 1 otherwise (sapo: g = 2/τ_±, by the sign of A), c the vLLM importance-sampling weight (token or sequence). The
gradient does not see g's value for sapo nor h's (its slope at ratio 1 is the same), so a loss value built from the
gradient's potential alone (−A per token) is wrong for sapo, cispo, vespo and with the correction. Each backward also
returns V_i = Σ_t m u g c h (`streaming/source.py`, per turn `streaming/turn_grpo.py`), the barrier reports
s_b·(free_i − A_i·V_i). Reward, content and turn release; the batch direction is checked alongside.
(The PARITY_CASES matrix under reward and content release checks the loss in `test_exactness_vs_trl.py`.)
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import (
    SHARED_PREFIX,
    CaptureGrads,
    cpu_config,
    load_model,
    offset_sampler_rollout_func,
    prompt_dataset,
    relative_error,
    reward_len,
    run_trainer,
)
from tests.fixtures.floors import assert_within_floor
from tests.fixtures.sampler_logprobs import _NoVLLM, rollout_with_sampler_logprobs
from tests.fixtures.tools import env_reward, replay_rollout_func
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

pytestmark = [pytest.mark.slow, pytest.mark.exactness]  # the exactness layer (scripts/kernel_passes.sh)
TOL = 1e-5

# each also with the shared-prefix backward (full passes, logged, where it refuses the options)
RELEASES = {"reward": dict(release="reward"), "content_batch_scope": dict(release="content", reward_scope="batch"),
            "reward_shared_prefix": dict(release="reward", **SHARED_PREFIX),
            "content_batch_scope_shared_prefix": dict(release="content", reward_scope="batch", **SHARED_PREFIX)}
GA2 = dict(gradient_accumulation_steps=2, per_device_train_batch_size=2)


def assert_logged_like_trl(got_trainer, ref_trainer, keys=("loss",), floor_runs=None) -> None:
    """Each logged key within TOL relative (1e-7 absolute) of TRL's, or, given `floor_runs` (name → a callable
    returning a stock TRL trainer on the same batch computed another way), within 2× TRL's own spread over them."""
    got, ref = got_trainer.state.log_history[0], ref_trainer.state.log_history[0]

    def spread(key, run):
        return lambda: abs(run().state.log_history[0][key] - ref[key]) / abs(ref[key])

    for key in keys:
        if abs(got[key] - ref[key]) <= 1e-7:
            continue
        assert_within_floor(abs(got[key] - ref[key]) / abs(ref[key]),
                            {name: spread(key, run) for name, run in (floor_runs or {}).items()}, at_least=TOL,
                            what=f"{key}: {got[key]} vs TRL's {ref[key]}, relative")


# The entropy bonus on: TRL logs `policy_loss` (the loss before the bonus) per micro-batch as well.
ENTROPY_CASES = {
    "sapo": dict(loss_type="sapo"),
    "sapo_temperatures": dict(loss_type="sapo", sapo_temperature_pos=0.5, sapo_temperature_neg=2.0),
    "cispo": dict(loss_type="cispo", epsilon_high=0.5),
    "vespo": dict(loss_type="vespo"),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
}


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("case", sorted(ENTROPY_CASES))
def test_loss_and_policy_loss_with_entropy_bonus_match_trl(case, release, tmp_path, tokenizer, tiny_model_path):
    overrides = dict(ENTROPY_CASES[case], **GA2, entropy_coef=0.5, max_steps=1, max_grad_norm=0.0)
    ref = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, tiny_model_path, **overrides)
    got = run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "ts", tokenizer, tiny_model_path,
                      **overrides, **RELEASES[release])
    assert relative_error(got.directions[0], ref.directions[0]) <= TOL
    assert_logged_like_trl(got.trainer, ref.trainer, ("loss", "policy_loss"))


# TRL's vLLM importance-sampling correction (not with vespo: refused, see test_vllm_importance_sampling.py): the
# per-token policy loss is multiplied by c (token modes) or c_i (sequence modes), the KL term is not.
IS_CASES = {
    "sapo_sequence_mask": dict(loss_type="sapo"),
    "cispo_token_truncate": dict(loss_type="cispo", epsilon_high=0.5, vllm_importance_sampling_mode="token_truncate",
                                 vllm_importance_sampling_clip_min=0.9, vllm_importance_sampling_clip_max=1.1),
    "dapo_token_mask_beta": dict(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.9,
                                 vllm_importance_sampling_clip_max=1.1, beta=0.1),
    "luspo_sequence_truncate": dict(loss_type="luspo", importance_sampling_level="sequence",
                                    vllm_importance_sampling_mode="sequence_truncate",
                                    vllm_importance_sampling_clip_min=0.5),
    "grpo_sequence_mask_entropy_ga2": dict(loss_type="grpo", entropy_coef=0.5, **GA2),
    "sapo_token_truncate_entropy_ga2": dict(loss_type="sapo", entropy_coef=0.5, **GA2,
                                            vllm_importance_sampling_mode="token_truncate",
                                            vllm_importance_sampling_clip_min=0.9,
                                            vllm_importance_sampling_clip_max=1.1),
    "cispo_sequence_mask_entropy": dict(loss_type="cispo", epsilon_high=0.5, entropy_coef=0.5),
}


def corrected_run(tmp_path, name, tokenizer, model_path, overrides, thundersync=None, member_order=None, **trl_extra):
    """Stock TRL with its vLLM correction on the scripted sampler log-probs (`thundersync`: None), or ThunderSync with
    those release options; returns (trainer, batch direction)."""
    trainer_cls, config_cls = ((GRPOTrainer, GRPOConfig) if thundersync is None
                               else (ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig))
    options = dict(use_vllm=True, vllm_mode="server", **trl_extra) if thundersync is None else thundersync
    capture = CaptureGrads()
    trainer = trainer_cls(model=load_model(model_path), reward_funcs=[reward_len],
                          args=cpu_config(config_cls, tmp_path / name, **options, **overrides),
                          train_dataset=prompt_dataset(), processing_class=tokenizer,
                          rollout_func=rollout_with_sampler_logprobs(tokenizer, member_order), callbacks=[capture])
    if thundersync is not None:  # as in test_vllm_importance_sampling: the same scripted trajectories, corrected
        trainer.args.use_vllm = True
    trainer.train()
    return trainer, capture.directions[0]


def trl_floor_runs(tmp_path, tokenizer, model_path, overrides) -> dict:
    """Stock TRL on the same rollouts computed other ways, each run once and only when asked for: its members
    reversed (the summation order only) and its batch padded to a multiple of 16/32/64 tokens (the forward's shapes,
    hence the logits' rounding, which any per-source pass changes too)."""
    options = {"trl reversed": dict(member_order="reverse"),
               **{f"trl pad {m}": dict(pad_to_multiple_of=m) for m in (16, 32, 64)}}

    def run(name):
        return functools.cache(lambda: corrected_run(tmp_path, name.replace(" ", "_"), tokenizer, model_path,
                                                     overrides, **options[name])[0])

    return {name: run(name) for name in options}


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("case", sorted(IS_CASES))
def test_loss_with_the_vllm_correction_matches_trl(case, release, tmp_path, tokenizer, tiny_model_path, monkeypatch):
    # cispo_sequence_mask_entropy's policy_loss Σ_i A_i·c_i·Σ_t log π_it cancels ~100× across each group, so it shows
    # the log-probs' last bits: the prefix path scores its rows with TRL's fused-head arithmetic
    # (`streaming/head_logps.py`; with log_softmax it was 1.9e-5 off TRL's). How far those bits move depends on the
    # CPU's kernels (1.07e-5 on an AVX2-only machine): past TOL, the loss is judged against TRL's own spread.
    import trl.trainer.grpo_trainer as trl_grpo

    monkeypatch.setattr(trl_grpo, "VLLMGeneration", _NoVLLM)
    overrides = dict(IS_CASES[case], max_steps=1, max_grad_norm=0.0)
    ref, ref_direction = corrected_run(tmp_path, "trl", tokenizer, tiny_model_path, overrides)
    got, got_direction = corrected_run(tmp_path, "thundersync", tokenizer, tiny_model_path, overrides,
                                       thundersync=RELEASES[release])
    assert relative_error(got_direction, ref_direction) <= TOL
    keys = ("loss", "policy_loss") if "entropy_coef" in overrides else ("loss",)
    assert_logged_like_trl(got, ref, keys, trl_floor_runs(tmp_path, tokenizer, tiny_model_path, overrides))
    assert ("prefix_forward" in {w.kind for w in got.last_batch[0].work}) == release.endswith("shared_prefix")


def test_cispo_policy_loss_against_trls_own_rounding(tmp_path, tokenizer, tiny_model_path, monkeypatch):
    """cispo_sequence_mask_entropy's logged policy_loss, shared prefix on, against stock TRL's own spread on the same
    rollouts (`trl_floor_runs`, all of them measured). Prints the figures that docs/rewards.md quotes (`-rP`)."""
    import trl.trainer.grpo_trainer as trl_grpo

    monkeypatch.setattr(trl_grpo, "VLLMGeneration", _NoVLLM)
    overrides = dict(IS_CASES["cispo_sequence_mask_entropy"], max_steps=1, max_grad_norm=0.0)

    def policy_loss(trainer) -> float:
        return trainer.state.log_history[0]["policy_loss"]

    ref = policy_loss(corrected_run(tmp_path, "trl", tokenizer, tiny_model_path, overrides)[0])
    errors = {name: abs(policy_loss(run()) - ref) / abs(ref)
              for name, run in trl_floor_runs(tmp_path, tokenizer, tiny_model_path, overrides).items()}
    floor = max(errors.values())
    for release in ("reward_shared_prefix", "content_batch_scope_shared_prefix"):
        trainer = corrected_run(tmp_path, release, tokenizer, tiny_model_path, overrides,
                                thundersync=RELEASES[release])[0]
        assert "prefix_forward" in {w.kind for w in trainer.last_batch[0].work}
        errors[release] = abs(policy_loss(trainer) - ref) / abs(ref)
    print("policy_loss relative to stock TRL's:", {name: f"{e:.2e}" for name, e in errors.items()})
    assert floor <= 1e-4, errors  # TRL's own spread: the last bits of a ~100× cancellation, nothing larger
    for release in ("reward_shared_prefix", "content_batch_scope_shared_prefix"):
        assert errors[release] <= max(TOL, 2 * floor), errors


# TRL's off-policy sequence mask: a dropped row (A < 0, sampler KL above the threshold) has no policy loss value.
OFF_POLICY_CASES = {"dapo": dict(), "sapo": dict(loss_type="sapo"),
                    "cispo_beta": dict(loss_type="cispo", epsilon_high=0.5, beta=0.1)}


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("case", sorted(OFF_POLICY_CASES))
def test_loss_with_the_off_policy_mask_matches_trl(case, release, tmp_path, tokenizer, tiny_model_path):
    overrides = dict(OFF_POLICY_CASES[case], per_device_train_batch_size=8, num_generations=4,
                     off_policy_mask_threshold=0.5, max_steps=1, max_grad_norm=0.0)
    ref = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, tiny_model_path,
                      rollout_func=offset_sampler_rollout_func(tokenizer), **overrides)
    got = run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "ts", tokenizer, tiny_model_path,
                      rollout_func=offset_sampler_rollout_func(tokenizer), **overrides, **RELEASES[release])
    assert got.trainer.last_off_policy_dropped, "the case must drop some rows"
    assert relative_error(got.directions[0], ref.directions[0]) <= TOL
    assert_logged_like_trl(got.trainer, ref.trainer)


# Multi-turn tool trajectories learned turn by turn (release="turn"), against TRL's rollout_func on the same tokens.
# The sampler's log-probs spread around the tiny model's (near uniform) so that the IS weights are not all clipped.
TURN_CASES = {
    "sapo_entropy": dict(loss_type="sapo", entropy_coef=0.5),
    "cispo_beta": dict(loss_type="cispo", epsilon_high=0.5, beta=0.1),
    "vespo": dict(loss_type="vespo"),
    "cispo_token_truncate": dict(loss_type="cispo", epsilon_high=0.5, use_vllm=True, vllm_mode="server",
                                 vllm_importance_sampling_mode="token_truncate",
                                 vllm_importance_sampling_clip_min=0.8, vllm_importance_sampling_clip_max=1.25),
    "sapo_sequence_truncate": dict(loss_type="sapo", use_vllm=True, vllm_mode="server",
                                   vllm_importance_sampling_mode="sequence_truncate",
                                   vllm_importance_sampling_clip_min=0.1, vllm_importance_sampling_clip_max=10.0),
}


@pytest.mark.parametrize("case", sorted(TURN_CASES))
def test_loss_of_turn_released_trajectories_matches_trl(case, tmp_path, tokenizer, tiny_model_path, monkeypatch):
    import trl.trainer.grpo_trainer as trl_grpo

    from benchmarks.scripted import ScriptedTurnGenerator
    from tests.fixtures.agentic_trainer import CounterEnv, dataset, script

    uniform = -math.log(len(tokenizer))

    class SpreadSampler(ScriptedTurnGenerator):
        def _act(self, request, key, max_new_tokens, version):
            rollout = super()._act(request, key, max_new_tokens, version)
            spread = tuple(uniform + 0.3 * ((request.index + j) % 3 - 1) for j in range(len(rollout.completion_ids)))
            return replace(rollout, sampling_logprobs=spread)

    monkeypatch.setattr(trl_grpo, "VLLMGeneration", _NoVLLM)
    common = dict(TURN_CASES[case], max_steps=1, max_completion_length=256, optim="sgd", max_grad_norm=0.0)
    capture = CaptureGrads()
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path / "ts", agent_max_turns=4, agent_protocol="paper",
                      release="turn", **common)
    trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[], args=args,
                                     train_dataset=dataset(), processing_class=tokenizer,
                                     environment_factory=CounterEnv, callbacks=[capture])
    trainer.use_turn_generator(SpreadSampler(tokenizer, script))
    captured = []
    original = trainer._barrier

    def spy(totals, timing, normalization, buckets, scored, prompts, *batch):
        captured.extend((s.rollout, s.reward) for s in scored)
        return original(totals, timing, normalization, buckets, scored, prompts, *batch)

    trainer._barrier = spy
    trainer.train()
    totals = trainer.last_batch[0]
    assert {"turn", "close"} <= {w.kind for w in totals.work} and totals.turn_fallbacks == 0
    rollout_func = replay_rollout_func([captured])

    ref_capture = CaptureGrads()
    ref = GRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[env_reward],
                      args=cpu_config(GRPOConfig, tmp_path / "trl", **common), train_dataset=dataset(),
                      processing_class=tokenizer, rollout_func=rollout_func, callbacks=[ref_capture])
    ref.train()
    assert relative_error(capture.directions[0], ref_capture.directions[0]) <= TOL
    keys = ("loss", "policy_loss") if "entropy_coef" in common else ("loss",)
    assert_logged_like_trl(trainer, ref, keys)
