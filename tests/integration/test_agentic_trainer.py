"""Multi-turn tool trajectories end to end: TRL-style environments, exactness vs TRL, schedules, metrics."""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import SHARED_PREFIX, CaptureGrads, cpu_config, load_model, relative_error
from tests.fixtures.agentic_trainer import dataset, make_trainer
from tests.fixtures.learner_work import assert_content_release
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.streaming import release as release_module

pytestmark = pytest.mark.slow


# options of both trainers: per-turn release with the KL term (a per-token term, exact per turn) and grpo's 1/|o_i|
# (a per-trajectory scalar applied when the last turn ends)
OPTIONS = {"plain": {}, "beta_grpo": dict(beta=0.1, loss_type="grpo")}
# ThunderSync only: each member's first turn starts from its group's shared prompt (`shared_prefix`), or not
PREFIX = {"": dict(shared_prefix=False), "_prefix": dict(SHARED_PREFIX)}


# "_adaptive": turn release where every step counts as learner-bound (adaptive_turn_release with a bound of 0): the
# first step releases per turn, the second runs as content release. The other turn cases release per turn throughout.
@pytest.mark.parametrize("release, options", [("reward", "plain"), ("content", "plain"), ("turn", "plain"),
                                              ("turn", "beta_grpo"), ("turn", "plain_prefix"),
                                              ("turn", "beta_grpo_prefix"), ("turn", "beta_grpo_prefix_adaptive")])
def test_multi_turn_training_matches_trl_on_the_same_trajectories(release, options, tmp_path, tokenizer,
                                                                  tiny_model_path, monkeypatch):
    adaptive = options.endswith("_adaptive")
    options = options.removesuffix("_adaptive")
    options, prefix = options.removesuffix("_prefix"), "_prefix" if options.endswith("_prefix") else ""
    if adaptive:
        monkeypatch.setattr(release_module, "LEARNER_BOUND", 0.0)
    trainer, capture, captured, generator = make_trainer(tmp_path / "ts", tokenizer, tiny_model_path,
                                                         delay=lambda i, t: 0.002 * ((7 * i + t) % 5),
                                                         release=release, **OPTIONS[options], **PREFIX[prefix],
                                                         adaptive_turn_release=adaptive)
    kinds_per_step = []
    original = trainer._barrier

    def spy(totals, *args):
        kinds_per_step.append({w.kind for w in totals.work})
        return original(totals, *args)

    trainer._barrier = spy
    trainer.train()
    if adaptive:  # step 1 per turn; step 2 after a learner-bound step: content release, no turn learned alone
        assert "turn" in kinds_per_step[0] and "turn" not in kinds_per_step[1], kinds_per_step
        logged = [h["thundersync/turns_released"] for h in trainer.state.log_history
                  if "thundersync/turns_released" in h]
        assert logged == [1.0, 0.0]
        release = "content"  # (what the last batch, checked below, ran as)
    totals = trainer.last_batch[0]
    kinds = {w.kind for w in totals.work}
    assert ("prefix_forward" in kinds and "prefix_backward" in kinds) == bool(prefix)
    if release == "content":
        assert_content_release(totals.work, options)
    else:
        assert {"reward": {"trajectory"}, "turn": {"turn", "close", "bind"}}[release] <= kinds, kinds
    if release == "turn":  # every trajectory learned turn by turn, none recomputed whole
        assert totals.turn_fallbacks == 0 and "content" not in kinds
        # (ready turns of one trajectory may be learned as one item: `turns` counts them)
        assert sum(w.turns for w in totals.work if w.kind == "turn") == sum(r.agent.turns for r, _ in captured[-1])
        logged = [h["thundersync/turns_released"] for h in trainer.state.log_history
                  if "thundersync/turns_released" in h]
        assert logged == [1.0, 1.0]
    assert generator.publications == [1, 2]
    # the learner thread's CPU per step: positive, and within the step's wall time
    steps = [h for h in trainer.state.log_history if "thundersync/step_wall_seconds" in h]
    assert len(steps) == 2 and all(
        0 < h["thundersync/learner_cpu_seconds"] <= h["thundersync/step_wall_seconds"] + 0.05 for h in steps)
    rollouts = [r for r, _ in captured[0]]
    assert any(0 in r.env_mask for r in rollouts), "observations must be in the context with mask 0"
    assert {r.agent.stop_reason for r in rollouts} == {"answered"}
    assert sum(r.agent.parse_errors for r in rollouts) == 1  # trajectory 1
    log = next(h for h in trainer.state.log_history if "agent/turns_mean" in h)
    assert log["tools/call_frequency"] > 1 and log["agent/turns_mean"] > 2
    # Feed the very same trajectories and environment rewards to stock TRL through rollout_func (+ env_mask).
    by_step = {step: {r.index: r for r, _ in pairs} for step, pairs in enumerate(captured)}
    rewards = {step: {r.index: reward for r, reward in pairs} for step, pairs in enumerate(captured)}

    def rollout_func(prompts, trl_trainer):
        step = trl_trainer.state.global_step
        rs = [by_step[step][i] for i in range(len(prompts))]
        return {"prompt_ids": [list(r.prompt_ids) for r in rs], "completion_ids": [list(r.completion_ids) for r in rs],
                "logprobs": [list(r.sampling_logprobs) for r in rs], "env_mask": [list(r.env_mask) for r in rs],
                "env_reward": [rewards[step][i] for i in range(len(prompts))]}

    def env_reward(env_reward, **kwargs):
        return env_reward

    ref_capture = CaptureGrads()
    args = cpu_config(GRPOConfig, tmp_path / "trl", max_steps=2, max_completion_length=256, optim="sgd",
                      **OPTIONS[options])
    ref = GRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[env_reward], args=args,
                      train_dataset=dataset(), processing_class=tokenizer, rollout_func=rollout_func,
                      callbacks=[ref_capture])
    ref.train()
    assert len(capture.directions) == len(ref_capture.directions) == 2
    for got, want in zip(capture.directions, ref_capture.directions, strict=True):
        assert want.norm() > 0
        assert relative_error(got, want) <= 1e-5


def test_schedules_give_identical_parameters_with_tools(tmp_path, tokenizer, tiny_model_path):
    params = {}
    for schedule in ("sync", "thundersync"):
        trainer, _, _, _ = make_trainer(tmp_path / schedule, tokenizer, tiny_model_path, schedule=schedule,
                                        delay=lambda i, t: 0.003 * ((5 * i + 3 * t) % 4))
        trainer.train()
        params[schedule] = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    # identical trajectories; the arrival (summation) order may differ with timing: equal up to FP32 rounding
    assert relative_error(params["thundersync"], params["sync"]) <= 1e-6


def test_plain_tools_and_the_real_embedded_engine(tmp_path, tokenizer, tiny_model_path):
    """tools=[...] with the embedded worker process: runs end to end and logs agent metrics."""

    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return key.upper()

    def reward_len(completion_ids, **kwargs):
        return [float(len(c)) for c in completion_ids]

    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, max_steps=2, max_completion_length=16,
                      max_tool_calling_iterations=1)
    trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len], args=args,
                                     train_dataset=dataset(), processing_class=tokenizer, tools=[lookup])
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.policy_version == 2
    log = next(h for h in trainer.state.log_history if "agent/turns_mean" in h)
    assert log["agent/turns_mean"] >= 1
