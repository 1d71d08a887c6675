"""`multi_objective_aggregation="normalize_then_sum"` and `off_policy_mask_threshold`, streamed, against stock
`trl.GRPOTrainer` on identical rollouts (FP32, ARCHITECTURE invariant 3).

normalize_then_sum: three reward functions with weights — lengths, a function returning None on some rows (some
groups have a single value: σ = NaN), a constant (σ = 0 in every group) — under every `scale_rewards` (TRL ignores it
there). The off-policy mask: the sampler's log-probs are the policy's own plus a per-trajectory offset
(`SAMPLER_OFFSETS`), so the rows' sequence KL is 0, 0.2, 0.8 or 1.0 against a threshold of 0.5; the test checks that
negative-advantage rows above it really are dropped, and that without the mask the direction would differ.
"""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import (
    SAMPLER_OFFSETS,
    SHARED_PREFIX,
    CaptureGrads,
    cpu_config,
    load_model,
    offset_sampler_rollout_func,
    relative_error,
    reward_constant,
    reward_len,
    reward_parity,
    run_trainer,
)
from tests.fixtures.floors import assert_within_floor, grpo_floor_runs
from tests.fixtures.learner_work import assert_content_release
from tests.fixtures.tools import env_reward, replay_rollout_func
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

pytestmark = pytest.mark.slow
TOL = 1e-5
REWARDS = (reward_len, reward_parity, reward_constant)
WEIGHTS = [0.5, 2.0, 1.0]
# each also with the shared-prefix backward (full passes, logged, where it refuses the options)
RELEASES = {"reward": dict(release="reward"), "content_batch_scope": dict(release="content", reward_scope="batch"),
            "reward_shared_prefix": dict(release="reward", **SHARED_PREFIX),
            "content_batch_scope_shared_prefix": dict(release="content", reward_scope="batch", **SHARED_PREFIX)}
OBJECTIVE = dict(multi_objective_aggregation="normalize_then_sum", reward_weights=WEIGHTS,
                 per_device_train_batch_size=8, num_generations=4)
THRESHOLD = 0.5


def both(tmp_path, tokenizer, model_path, release, rollout=None, ts_only=None, **overrides):
    kwargs = dict(rewards=REWARDS, **overrides)
    ref = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, model_path,
                      rollout_func=rollout(tokenizer) if rollout else None, **kwargs)
    got = run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "ts", tokenizer, model_path,
                      rollout_func=rollout(tokenizer) if rollout else None, **kwargs, **RELEASES[release],
                      **(ts_only or {}))
    return ref, got


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_normalize_then_sum_direction_matches_trl(scale, release, tmp_path, tokenizer, tiny_model_path):
    ref, got = both(tmp_path, tokenizer, tiny_model_path, release, **OBJECTIVE, scale_rewards=scale, max_steps=1,
                    max_grad_norm=0.0)
    assert len(ref.directions) == len(got.directions) == 1 and ref.directions[0].norm() > 0
    assert relative_error(got.directions[0], ref.directions[0]) <= TOL
    # the logged statistics, as TRL logs them
    ref_logs, got_logs = ref.trainer.state.log_history[0], got.trainer.state.log_history[0]
    for name in ("reward", "reward_std", "frac_reward_zero_std", "rewards/reward_parity/mean",
                 "rewards/reward_parity/std", "rewards/reward_constant/std", "loss"):
        assert got_logs[name] == pytest.approx(ref_logs[name], rel=1e-5, abs=1e-6), name
    assert len(ref.trainer._logs["advantages"]) == 8
    assert list(got.trainer._logs["advantages"]) == pytest.approx(list(ref.trainer._logs["advantages"]), abs=1e-4)
    assert got_logs["thundersync/stats_peak_mb"] <= got_logs["thundersync/stats_bound_mb"]


def test_normalize_then_sum_is_not_sum_then_normalize(tmp_path, tokenizer, tiny_model_path):
    """What a naive port (the default aggregation, or the group-normalized sum) would produce is far off."""
    ref, _ = both(tmp_path / "a", tokenizer, tiny_model_path, "reward", **OBJECTIVE, max_steps=1, max_grad_norm=0.0)
    plain = {k: v for k, v in OBJECTIVE.items() if k != "multi_objective_aggregation"}
    other = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "b", tokenizer, tiny_model_path, rewards=REWARDS,
                        **plain, max_steps=1, max_grad_norm=0.0)
    assert relative_error(other.directions[0], ref.directions[0]) > 1e-2


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("case", ["ga2_bnpo_beta", "dapo"])
def test_normalize_then_sum_three_sgd_steps_match_trl(case, release, tmp_path, tokenizer, tiny_model_path):
    extra = dict(gradient_accumulation_steps=2, per_device_train_batch_size=4, loss_type="bnpo", beta=0.1) \
        if case == "ga2_bnpo_beta" else {}
    ref, got = both(tmp_path, tokenizer, tiny_model_path, release, **{**OBJECTIVE, **extra}, max_steps=3,
                    max_grad_norm=0.5, optim="sgd", learning_rate=1e-2)
    assert len(ref.directions) == len(got.directions) == 3
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(tiny_model_path).parameters()])
    assert (ref.params - initial).norm() > 0
    assert relative_error(got.params - initial, ref.params - initial) <= TOL
    for a, b in zip(got.directions, ref.directions, strict=True):
        assert relative_error(a, b) <= TOL


OFF_POLICY = {
    "dapo": dict(),
    "scale_batch": dict(scale_rewards="batch"),
    "grpo_beta": dict(loss_type="grpo", beta=0.1),  # the KL term is not masked
    "normalize_then_sum": dict(OBJECTIVE),  # the sign needs the batch mean: decided at the barrier
    "capped": dict(),  # one open group, two release buffers: masked rows count against the caps
    "ga2_bnpo_beta": dict(gradient_accumulation_steps=2, per_device_train_batch_size=4, loss_type="bnpo", beta=0.1),
}
TS_ONLY = {"capped": dict(max_open_groups=1, max_buffered_trajectories=2)}


def dropped_rows_expected(trainer) -> list[int]:
    """Rows TRL's mask drops in the last batch: A < 0 and KL (the row's sampler offset) > threshold."""
    advantages = list(trainer._logs["advantages"])[-trainer.args.per_device_train_batch_size
                                                   * trainer.args.steps_per_generation:]
    return [i for i, a in enumerate(advantages) if a < 0 and SAMPLER_OFFSETS[i % len(SAMPLER_OFFSETS)] > THRESHOLD]


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("case", sorted(OFF_POLICY))
def test_off_policy_mask_direction_matches_trl(case, release, tmp_path, tokenizer, tiny_model_path):
    overrides = {**dict(per_device_train_batch_size=8, num_generations=4), **OFF_POLICY[case]}
    overrides.update(off_policy_mask_threshold=THRESHOLD, max_steps=1, max_grad_norm=0.0)
    ref, got = both(tmp_path, tokenizer, tiny_model_path, release, rollout=offset_sampler_rollout_func,
                    ts_only=TS_ONLY.get(case), **overrides)
    assert len(ref.directions) == len(got.directions) == 1 and ref.directions[0].norm() > 0
    assert relative_error(got.directions[0], ref.directions[0]) <= TOL
    expected = dropped_rows_expected(ref.trainer)
    assert expected, "the case must drop some negative-advantage rows"
    assert list(got.trainer.last_off_policy_dropped) == expected
    logs = got.trainer.state.log_history[0]
    assert logs["thundersync/stats_peak_mb"] <= logs["thundersync/stats_bound_mb"]
    # without the mask TRL's direction is another one: the mask is really exercised
    overrides.pop("off_policy_mask_threshold")
    unmasked = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "unmasked", tokenizer, tiny_model_path,
                           rewards=REWARDS, rollout_func=offset_sampler_rollout_func(tokenizer), **overrides)
    assert relative_error(unmasked.directions[0], ref.directions[0]) > 1e-3


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_off_policy_mask_three_sgd_steps_match_trl(release, tmp_path, tokenizer, tiny_model_path):
    ref, got = both(tmp_path, tokenizer, tiny_model_path, release, rollout=offset_sampler_rollout_func,
                    per_device_train_batch_size=8, num_generations=4, off_policy_mask_threshold=THRESHOLD,
                    max_steps=3, max_grad_norm=0.5, optim="sgd", learning_rate=1e-2)
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(tiny_model_path).parameters()])
    assert relative_error(got.params - initial, ref.params - initial) <= TOL
    for a, b in zip(got.directions, ref.directions, strict=True):
        assert relative_error(a, b) <= TOL


def test_off_policy_mask_without_sampler_logprobs_masks_nothing(tmp_path, tokenizer, tiny_model_path):
    """Local generation (no sampler log-probs in TRL): TRL compares the policy with itself, KL 0, nothing dropped."""
    args = ThunderSyncGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1,
                                 per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
                                 off_policy_mask_threshold=0.0, rollout_engine="local_thread", save_strategy="no",
                                 gradient_checkpointing=False, disable_tqdm=True)
    from benchmarks.parity import prompt_dataset

    trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len], args=args,
                                     train_dataset=prompt_dataset(), processing_class=tokenizer)
    trainer.train()
    assert trainer.last_off_policy_dropped == ()


@pytest.mark.exactness
def test_normalize_then_sum_within_twice_the_permuted_floor(tmp_path, tokenizer, tiny_model_path):
    """3 SGD steps: ThunderSync's Δθ is as close to TRL's as TRL with each group's members permuted or its batch
    padded (×2, `tests/fixtures/floors.py`)."""
    kw = dict(OBJECTIVE, max_steps=3, max_grad_norm=0.5, optim="sgd", learning_rate=1e-2)
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(tiny_model_path).parameters()])
    ref = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, tiny_model_path, rewards=REWARDS, **kw)
    delta = ref.params - initial
    got = run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "ts", tokenizer, tiny_model_path,
                      rewards=REWARDS, release="content", **kw)
    floor = {name: (lambda run=run: relative_error(run().params - initial, delta))
             for name, run in grpo_floor_runs(tmp_path, tokenizer, tiny_model_path, rewards=REWARDS, **kw).items()}
    assert_within_floor(relative_error(got.params - initial, delta), floor, largest=1e-5, what="Δθ")


class _NoVLLM:
    """Stands in for TRL's `VLLMGeneration` in the reference trainer (trajectories come from `rollout_func`)."""

    def __init__(self, **kwargs) -> None:
        from types import SimpleNamespace

        info = {"model_config": {"logprobs_mode": "processed_logprobs"}}
        self.vllm_client = SimpleNamespace(get_server_info=lambda: info)

    def sync_weights(self) -> None:
        return None


@pytest.mark.parametrize("release", ["turn", "content"])
def test_off_policy_mask_on_multi_turn_tool_trajectories_matches_trl(release, tmp_path, tokenizer, tiny_model_path,
                                                                    monkeypatch):
    """release="turn": the statistic comes from the turns' own log-probs. The sampler (a scripted agent standing in
    for a vLLM server, hence use_vllm=True on both sides, without the IS correction) reports log-probs +20 on three
    rows of four, so their KL is far above the threshold of 10 and their policy term is dropped where A < 0."""
    from dataclasses import replace

    import trl.trainer.grpo_trainer as trl_grpo

    from benchmarks.scripted import ScriptedTurnGenerator
    from tests.fixtures.agentic_trainer import CounterEnv, dataset, script

    class OffsetSampler(ScriptedTurnGenerator):
        def _act(self, request, key, max_new_tokens, version):
            rollout = super()._act(request, key, max_new_tokens, version)
            offset = 0.0 if request.index % 4 == 0 else 20.0
            return replace(rollout, sampling_logprobs=tuple(v + offset for v in rollout.sampling_logprobs))

    monkeypatch.setattr(trl_grpo, "VLLMGeneration", _NoVLLM)
    common = dict(max_steps=1, max_completion_length=256, optim="sgd", max_grad_norm=0.0, use_vllm=True,
                  vllm_mode="server",
                  vllm_importance_sampling_correction=False, off_policy_mask_threshold=10.0, loss_type="grpo",
                  beta=0.1)
    capture = CaptureGrads()
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path / "ts", agent_max_turns=4, agent_protocol="paper",
                      release=release, **common)
    trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[], args=args,
                                     train_dataset=dataset(), processing_class=tokenizer,
                                     environment_factory=CounterEnv, callbacks=[capture])
    trainer.use_turn_generator(OffsetSampler(tokenizer, script))
    captured = []
    original = trainer._barrier

    def spy(totals, timing, normalization, buckets, scored, prompts, *batch):
        captured.extend((s.rollout, s.reward) for s in scored)
        return original(totals, timing, normalization, buckets, scored, prompts, *batch)

    trainer._barrier = spy
    trainer.train()
    work = trainer.last_batch[0].work
    if release == "turn":
        assert {"turn", "close"} <= {w.kind for w in work} and trainer.last_batch[0].turn_fallbacks == 0
    else:
        assert_content_release(work, release)
    rollout_func = replay_rollout_func([captured])

    ref_capture = CaptureGrads()
    ref = GRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[env_reward],
                      args=cpu_config(GRPOConfig, tmp_path / "trl", **common),
                      train_dataset=dataset(), processing_class=tokenizer, rollout_func=rollout_func,
                      callbacks=[ref_capture])
    ref.train()
    advantages = list(ref._logs["advantages"])
    expected = [i for i, a in enumerate(advantages) if a < 0 and i % 4 != 0]
    assert expected, "the case must drop some negative-advantage rows"
    assert list(trainer.last_off_policy_dropped) == expected
    assert relative_error(capture.directions[0], ref_capture.directions[0]) <= TOL


def test_normalize_then_sum_zero_batch_spread_logs_as_trl(tmp_path, tokenizer, tiny_model_path):
    """Every R_i = 0 (a constant reward): σ_B = 0, TRL logs frac_reward_zero_std = 1 and takes a zero policy step."""
    kw = dict(OBJECTIVE, reward_weights=[1.0], max_steps=1, max_grad_norm=0.0)
    ref = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, tiny_model_path,
                      rewards=(reward_constant,), **kw)
    got = run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "ts", tokenizer, tiny_model_path,
                      rewards=(reward_constant,), **kw)
    ref_logs, got_logs = ref.trainer.state.log_history[0], got.trainer.state.log_history[0]
    assert ref_logs["frac_reward_zero_std"] == got_logs["frac_reward_zero_std"] == 1.0
    assert got_logs["loss"] == pytest.approx(ref_logs["loss"], abs=1e-9)
    assert float(ref.directions[0].norm()) == float(got.directions[0].norm()) == 0.0
