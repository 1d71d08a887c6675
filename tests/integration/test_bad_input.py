"""Bad input gets a clear, typed error naming the problem, and no optimizer step is taken."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from benchmarks.parity import cpu_config, load_model, prompt_dataset, reward_len, scripted_rollout_func
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.errors import (
    ConfigurationError,
    NonFiniteGradientError,
    RewardFunctionError,
    StalePolicyError,
    UnscorableGroupError,
    UnsupportedOptionError,
)

pytestmark = pytest.mark.slow


def make(tmp_path, tokenizer, path, rewards, model=None, **overrides):
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, max_steps=1, **overrides)
    return ThunderSyncGRPOTrainer(model=model or load_model(path), reward_funcs=rewards, args=args,
                                  train_dataset=prompt_dataset(), processing_class=tokenizer,
                                  rollout_func=scripted_rollout_func(tokenizer))


def params_of(trainer):
    return torch.cat([p.detach().reshape(-1).clone() for p in trainer.model.parameters()])


def reward_too_many(completion_ids, **kwargs):
    return [1.0, 2.0]


def reward_raises(completion_ids, **kwargs):
    raise KeyError("answer")


def reward_all_none(completion_ids, **kwargs):
    return [None for _ in completion_ids]


def reward_nan(completion_ids, **kwargs):
    return [float("nan") for _ in completion_ids]


@pytest.mark.parametrize("func, pattern", [
    (reward_too_many, "reward function 'reward_too_many' returned 2 rewards for 1 completion"),
    (reward_raises, "reward function 'reward_raises' raised KeyError"),
    (reward_nan, "reward function 'reward_nan' returned nan"),
])
def test_bad_reward_functions_raise_and_do_not_step(func, pattern, tmp_path, tokenizer, tiny_model_path):
    trainer = make(tmp_path, tokenizer, tiny_model_path, [reward_len, func])
    before = params_of(trainer)
    with pytest.raises(RewardFunctionError, match=pattern):
        trainer.train()
    assert trainer.state.global_step == 0
    assert torch.equal(params_of(trainer), before)


def test_all_rewards_none_for_a_group(tmp_path, tokenizer, tiny_model_path):
    trainer = make(tmp_path, tokenizer, tiny_model_path, [reward_all_none], allow_unscorable_groups=False)
    with pytest.raises(UnscorableGroupError, match="every reward function returned None .* group 0"):
        trainer.train()
    allowed = make(tmp_path / "ok", tokenizer, tiny_model_path, [reward_all_none])
    allowed.train()  # the default, TRL semantics: zero advantage, the step still happens
    assert allowed.state.global_step == 1


def test_batch_not_divisible_by_group_size(tmp_path):
    with pytest.raises(ConfigurationError, match="divisible by num_generations"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, per_device_train_batch_size=3, num_generations=2)


@pytest.mark.parametrize("field, value", [
    ("loss_type", "nope"), ("num_iterations", 0), ("top_entropy_quantile", 0.5),
    ("delta", 0.5), ("multi_objective_aggregation", "nope"),
    ("schedule", "async"), ("max_open_groups", 0),
])
def test_unsupported_options_are_refused_naming_the_field(field, value, tmp_path):
    with pytest.raises(ConfigurationError, match=f"{field}={value!r}"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, **{field: value})


def test_steps_per_generation_must_mean_one_step_per_batch(tmp_path):
    with pytest.raises(UnsupportedOptionError, match="steps_per_generation=4.*gradient_accumulation_steps=2"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, gradient_accumulation_steps=2, steps_per_generation=4)


def test_non_finite_log_probs_refuse_the_step_and_name_the_trajectory(tmp_path, tokenizer, tiny_model_path):
    model = load_model(tiny_model_path)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    trainer = make(tmp_path, tokenizer, tiny_model_path, [reward_len], model=model)
    with pytest.raises(NonFiniteGradientError, match="trajectory \\d+ \\(group \\d+\\) has non-finite"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_non_finite_batch_direction_is_refused(tmp_path, tokenizer, tiny_model_path):
    trainer = make(tmp_path, tokenizer, tiny_model_path, [reward_len])

    def failing_sum(tensor):  # a broken all-reduce: the global loss-token count comes back as NaN
        return torch.full_like(tensor, float("nan"), dtype=torch.float64)

    trainer.collectives = replace(trainer.collectives, sum=failing_sum)
    with pytest.raises(NonFiniteGradientError, match="batch direction of optimizer step 0"):
        trainer.train()


class ForeignVersionEngine:
    def __init__(self, inner):
        self.inner = inner

    def start_batch(self, requests, policy_version):
        self.inner.start_batch(requests, policy_version)

    def results(self):
        from dataclasses import replace

        for r in self.inner.results():
            yield replace(r, policy_version=r.policy_version + 1) if r.index == 2 else r

    def publish(self, model, policy_version):
        return self.inner.publish(model, policy_version)

    def close(self):
        self.inner.close()


def test_trajectory_with_a_foreign_policy_version_is_refused(tmp_path, tokenizer, tiny_model_path):
    trainer = make(tmp_path, tokenizer, tiny_model_path, [reward_len])
    trainer._engine = ForeignVersionEngine(trainer._rollout_engine())
    before = params_of(trainer)
    with pytest.raises(StalePolicyError, match="trajectory 2 .* version 1, but the learner is accumulating version 0"):
        trainer.train()
    assert torch.equal(params_of(trainer), before)


def test_tools_cannot_be_combined_with_rollout_func(tmp_path, tokenizer, tiny_model_path):
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first
            b: second
        """
        return a + b

    args = cpu_config(ThunderSyncGRPOConfig, tmp_path)
    with pytest.raises(UnsupportedOptionError, match="cannot be combined with rollout_func"):
        ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len], args=args,
                               train_dataset=prompt_dataset(), processing_class=tokenizer, tools=[add],
                               rollout_func=scripted_rollout_func(tokenizer))
