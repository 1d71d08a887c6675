"""`reward_scope` against stock `trl.GRPOTrainer`: group- and batch-relative rewards, the "auto" probe, bad calls.

Exactness is judged against the FP32 floor (`tests/fixtures/floors.py`): stock TRL against itself on the same
completions with each group's members permuted (reversed and rotated), which changes nothing but the summation order,
or the batch padded to 16 tokens; the largest of these. Both rewards here are permutation-equivariant, so that floor
is the rounding noise any exact implementation must be allowed.
"""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import (
    cpu_config,
    load_model,
    prompt_dataset,
    relative_error,
    reward_batch_relative_length,
    reward_group_rank,
    reward_len,
    run_trainer,
    scripted_rollout_func,
)
from tests.fixtures.floors import assert_within_floor, grpo_floor_runs
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.errors import RewardFunctionError, RewardScopeError

pytestmark = [pytest.mark.slow, pytest.mark.exactness]  # the exactness layer (scripts/kernel_passes.sh)

# 2 groups of 4 per batch, 3 SGD steps (linear in the gradient, so Δθ compares the directions themselves)
THREE_SGD_STEPS = dict(max_steps=3, optim="sgd", learning_rate=1e-2, num_generations=4,
                       per_device_train_batch_size=8, logging_steps=100)


def flat(model):
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def displacement_errors(tmp_path, tokenizer, model_path, reward, scopes, **overrides):
    """Relative error of Δθ against stock TRL: ThunderSync per reward_scope, and the floor's reorderings (lazy)."""
    kw = dict(THREE_SGD_STEPS, **overrides)
    initial = flat(load_model(model_path))
    ref = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, model_path, rewards=(reward,), **kw)
    delta = ref.params - initial
    assert delta.norm() > 0

    def error(run):
        return relative_error(run.params - initial, delta)

    floor = {name: (lambda run=run: error(run()))
             for name, run in grpo_floor_runs(tmp_path, tokenizer, model_path, rewards=(reward,), **kw).items()}
    got = {}
    for scope in scopes:  # "group" = reward release; "group/content" = the same scope released at content readiness
        name, _, release = scope.partition("/")
        out = tmp_path / scope.replace("/", "-")
        got[scope] = error(run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, out, tokenizer, model_path,
                                       rewards=(reward,), reward_scope=name, release=release or "reward", **kw))
    return floor, got


def test_group_relative_reward_under_group_scope_matches_trl(tmp_path, tokenizer, tiny_model_path):
    floor, got = displacement_errors(tmp_path, tokenizer, tiny_model_path, reward_group_rank,
                                     ("group", "group/content", "trajectory"), max_grad_norm=0.5)
    assert_within_floor(got["group"], floor, largest=1e-5, what="group scope")
    assert_within_floor(got["group/content"], floor, largest=1e-5, what="content release")
    assert got["trajectory"] > 0.5  # called one completion at a time, the rank is 0 for everyone: no signal


def test_batch_relative_reward_under_batch_scope_matches_trl(tmp_path, tokenizer, tiny_model_path):
    # scale_rewards="batch" without clipping: the batch σ then scales the update, and it depends on the batch mean
    # that only the batch call sees (a group call shifts each group's rewards by a different constant).
    floor, got = displacement_errors(tmp_path, tokenizer, tiny_model_path, reward_batch_relative_length,
                                     ("batch", "batch/content", "group", "trajectory"), scale_rewards="batch",
                                     max_grad_norm=0.0)
    assert_within_floor(got["batch"], floor, largest=1e-5, what="batch scope")
    assert_within_floor(got["batch/content"], floor, largest=1e-5, what="content release")
    assert got["group"] > 1e-2 and got["trajectory"] > 0.5


def make(tmp_path, tokenizer, model_path, rewards, **overrides):
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, **overrides)
    return ThunderSyncGRPOTrainer(model=load_model(model_path), reward_funcs=rewards, args=args,
                                  train_dataset=prompt_dataset(), processing_class=tokenizer,
                                  rollout_func=scripted_rollout_func(tokenizer))


def test_auto_refuses_a_batch_relative_reward_before_any_step(tmp_path, tokenizer, tiny_model_path):
    trainer = make(tmp_path, tokenizer, tiny_model_path, [reward_len, reward_batch_relative_length], max_steps=2)
    assert trainer.args.reward_scope == "auto"
    before = flat(trainer.model)
    with pytest.raises(RewardScopeError, match="reward function 'reward_batch_relative_length' depends on the other "
                       r"completions.* group 0 \(trajectories 0\.\.1\).*reward_scope='group'.*reward_scope='batch'.*"
                       "reward_scope='trajectory'"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert torch.equal(flat(trainer.model), before)


class CountingLen:
    """reward_len, recording how many completions each call had."""

    __name__ = "counting_len"

    def __init__(self):
        self.sizes = []

    def __call__(self, completion_ids, **kwargs):
        self.sizes.append(len(completion_ids))
        return reward_len(completion_ids)


def test_auto_trains_a_per_sample_reward_exactly_as_trajectory_scope(tmp_path, tokenizer, tiny_model_path):
    """The same update up to FP32 rounding: which of a group's members wait together for the learner (and so share a
    padded pass) depends on timing, so two runs need not round alike (it differed under AVX2 kernels on a loaded
    machine); the displacement is compared against the architecture's 1e-5."""
    initial = flat(load_model(tiny_model_path))
    runs = {}
    for scope in ("auto", "trajectory"):
        reward = CountingLen()
        trainer = make(tmp_path / scope, tokenizer, tiny_model_path, [reward], max_steps=2, reward_scope=scope)
        trainer.train()
        runs[scope] = (flat(trainer.model), reward.sizes)
    assert relative_error(runs["auto"][0] - initial, runs["trajectory"][0] - initial) <= 1e-5
    assert runs["trajectory"][1] == [1] * 8  # 2 steps × 4 trajectories, one at a time
    assert runs["auto"][1] == [1, 1, 2] + [1] * 6  # + one probe call on the first group, once per run


class FailsOnSecondCall:
    def __init__(self, failure):
        self.failure, self.calls = failure, 0
        self.__name__ = f"fails_{failure}"

    def __call__(self, completion_ids, **kwargs):
        self.calls += 1
        if self.calls < 2:
            return reward_len(completion_ids)
        if self.failure == "raises":
            raise KeyError("answer")
        return reward_len(completion_ids)[:-1] if self.failure == "short" else 1.0


@pytest.mark.parametrize("scope, where", [("group", r"group 1 \(trajectories 2\.\.3\)"),
                                          ("batch", r"the generation batch \(trajectories 0\.\.3, groups 0\.\.1\)")])
@pytest.mark.parametrize("failure, what", [("raises", "raised KeyError"), ("short", "returned \\d rewards for \\d "
                                           "completions"), ("scalar", "returned float")])
def test_bad_group_or_batch_call_is_named_and_takes_no_step(scope, where, failure, what, tmp_path, tokenizer,
                                                             tiny_model_path):
    reward = FailsOnSecondCall(failure)
    trainer = make(tmp_path, tokenizer, tiny_model_path, [reward_len, reward], max_steps=2, reward_scope=scope)
    before = flat(trainer.model)
    # group scope fails on group 1 of the first batch (group 0's learner work already ran: no partial step);
    # batch scope on the second batch, after one good step
    with pytest.raises(RewardFunctionError, match=f"reward function 'fails_{failure}' {what}.* on {where}"):
        trainer.train()
    assert trainer.state.global_step == (0 if scope == "group" else 1)
    if scope == "group":
        assert torch.equal(flat(trainer.model), before)


async def reward_async_group_rank(prompts, completion_ids, **kwargs):
    return reward_group_rank(prompts, completion_ids)


def test_reward_model_is_batched_per_call_and_matches_trl(tmp_path, tokenizer, tiny_model_path):
    """One right-padded forward per call, as TRL does; async functions run on TRL's event loop in every scope."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    reward_model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1)
    reward_model.config.pad_token_id = tokenizer.pad_token_id
    batch_sizes = []
    reward_model.register_forward_hook(lambda module, args, kwargs, out: batch_sizes.append(out.logits.shape[0]),
                                       with_kwargs=True)
    kw = dict(max_steps=1, max_grad_norm=0.0, rewards=(reward_async_group_rank, reward_model),
              reward_processing_classes=[None, tokenizer], reward_weights=[1.0, 10.0])
    ref = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, tiny_model_path, **kw)
    assert batch_sizes == [4]
    name = ref.trainer.reward_func_names[1]
    for scope, sizes in (("group", [2, 2]), ("batch", [4])):
        batch_sizes.clear()
        got = run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / scope, tokenizer,
                          tiny_model_path, reward_scope=scope, **kw)
        assert batch_sizes == sizes, scope
        assert relative_error(got.directions[0], ref.directions[0]) <= 1e-5
        assert torch.allclose(torch.tensor(got.trainer._logs["rewards"][name]),
                              torch.tensor(ref.trainer._logs["rewards"][name]), rtol=1e-5, atol=1e-6)


class EnvironmentRank:
    """Group-relative reward over environments: rank of the counter among the call's environments of one target."""

    __name__ = "environment_rank"

    def __init__(self):
        self.calls = []

    def __call__(self, environments, target, completion_ids, **kwargs):
        self.calls.append((len(environments), [e.target for e in environments] == list(target)))
        return [float(sum(o.count < e.count for o in environments if o.target == e.target)) for e in environments]


@pytest.mark.parametrize("scope, call_sizes", [("group", [2] * 4), ("batch", [4] * 2)])
def test_environments_and_their_rewards_in_group_and_batch_scope(scope, call_sizes, tmp_path, tokenizer,
                                                                 tiny_model_path):
    from benchmarks.scripted import ScriptedTurnGenerator
    from tests.fixtures.agentic_trainer import CounterEnv, dataset, script

    params, logged = {}, {}
    for run_scope in (scope, "trajectory"):
        rank = EnvironmentRank()
        args = cpu_config(ThunderSyncGRPOConfig, tmp_path / run_scope, max_steps=2, max_completion_length=256,
                          agent_protocol="paper", agent_max_turns=4, optim="sgd", reward_scope=run_scope)
        trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[rank], args=args,
                                         train_dataset=dataset(), processing_class=tokenizer,
                                         environment_factory=CounterEnv)
        trainer.use_turn_generator(ScriptedTurnGenerator(tokenizer, script,
                                                         delay=lambda i, t: 0.002 * ((7 * i + t) % 5)))
        trainer.train()
        params[run_scope] = flat(trainer.model)
        logged[run_scope] = trainer._logs["rewards"]
        if run_scope == scope:  # one call per group / batch, each seeing its own rows' environments in row order
            assert rank.calls == [(n, True) for n in call_sizes]
    assert logged[scope]["CounterEnv"] == logged["trajectory"]["CounterEnv"]  # get_reward is per episode
    assert logged[scope]["environment_rank"] != logged["trajectory"]["environment_rank"]  # alone, rank is 0
    assert not torch.equal(params[scope], params["trajectory"])


def test_unknown_reward_scope_is_refused_naming_the_field(tmp_path):
    from trl_thundersync.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="reward_scope='episode' is not one of"):
        cpu_config(ThunderSyncGRPOConfig, tmp_path, reward_scope="episode")


def reward_that_logs(completion_ids, log_extra, log_metric, **kwargs) -> list[float]:
    """A TRL reward that uses both log hooks: a table column per completion and one scalar per call."""
    sums = [float(sum(c)) for c in completion_ids]
    log_extra("id_sum", sums)
    log_metric("custom/mean_len", sum(len(c) for c in completion_ids) / len(completion_ids))
    return [float(len(c)) for c in completion_ids]


def logged(trainer):
    """The completions table's rows (completion text, id_sum) and the logged custom metric of every step."""
    table = list(zip(trainer._logs["completion"], trainer._logs["extra"]["id_sum"], strict=True))
    metric = [entry["custom/mean_len"] for entry in trainer.state.log_history if "custom/mean_len" in entry]
    return table, metric


@pytest.mark.parametrize("scope", ["trajectory", "batch"])
def test_log_extra_and_log_metric_reach_the_logs_as_in_trl(tmp_path, tokenizer, tiny_model_path, scope):
    kw = dict(max_steps=2, num_generations=4, per_device_train_batch_size=8, logging_steps=1)
    ref = run_trainer(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, tiny_model_path,
                      rewards=(reward_that_logs,), **kw)
    run = run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / scope, tokenizer, tiny_model_path,
                      rewards=(reward_that_logs,), reward_scope=scope, **kw)
    ref_table, ref_metric = logged(ref.trainer)
    table, metric = logged(run.trainer)
    assert len(ref_table) == 8 and len(ref_metric) == 2  # TRL keeps the last generation batch in the table
    # every row's column value belongs to that row's completion (one call per trajectory or one per batch)
    assert sorted(table) == sorted(ref_table)
    sum_of = {text: s for text, s in ref_table}
    assert all(sum_of[text] == s for text, s in table)
    # per-call means averaged over the step: the batch mean either way for this metric, as TRL logs it
    assert metric == pytest.approx(ref_metric, rel=1e-6)


def test_log_extra_with_the_wrong_number_of_values_names_the_function(tmp_path, tokenizer, tiny_model_path):
    def reward_logs_too_much(completion_ids, log_extra, **kwargs):
        log_extra("col", [0.0, 1.0])
        return [0.0] * len(completion_ids)

    trainer = make(tmp_path, tokenizer, tiny_model_path, [reward_logs_too_much], reward_scope="trajectory",
                   max_steps=1, num_generations=4, per_device_train_batch_size=8)
    with pytest.raises(RewardFunctionError, match=r"reward_logs_too_much.*log_extra\('col'.*2 values.*1 completions"):
        trainer.train()
