"""Both trainers sample through an injected `TurnGenerator` (`trainer.use_turn_generator`): the 30-line stub of the
seam's unit tests drives a GRPO agent run, a single-turn GRPO run and a GKD run, and is published to and closed by
the trainer."""

from __future__ import annotations

import pytest
from datasets import Dataset

from benchmarks.parity import cpu_config, load_model, prompt_dataset, reward_len, scripted_rollout_func
from tests.fixtures.stub_generator import StubGenerator
from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer, ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.errors import UnsupportedOptionError
from trl_thundersync.rollout.agent_engine import AgentRolloutEngine
from trl_thundersync.rollout.batches import TurnBatchEngine

pytestmark = pytest.mark.slow


class CounterEnv:
    def reset(self, **row) -> str | None:
        self.count = 0
        return None

    def increment(self, amount: int) -> str:
        """Add an amount to the counter.

        Args:
            amount: how much to add
        """
        self.count += amount
        return f"counter={self.count}"

    def get_reward(self) -> float:
        return float(self.count)


def answer(tokenizer) -> list[int]:
    return tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]


def chat_prompts(n=4):
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Count to {i}."}] for i in range(n)]})


def test_grpo_agent_run_over_an_injected_generator(tmp_path, tokenizer, tiny_model_path):
    stub = StubGenerator(answer(tokenizer))
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, max_steps=2, max_completion_length=64, optim="sgd",
                      max_tool_calling_iterations=1)
    trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[], args=args,
                                     train_dataset=chat_prompts(), processing_class=tokenizer,
                                     environment_factory=CounterEnv)
    engine = trainer.use_turn_generator(stub)
    assert isinstance(engine, AgentRolloutEngine) and engine.generator is stub and trainer.rollout_engine is engine
    assert engine.chat_template == trainer.chat_template  # make_agent_engine's rule is TRL's choice
    trainer.train()
    assert stub.publications == [1, 2] and stub.closed
    assert len(stub.keys) == 2 * 4 and all(turn == 0 for _, turn in stub.keys)  # one turn per trajectory
    logged = trainer.state.log_history[0]
    assert logged["rollout/stub_requests"] == 4.0  # the generator's own step metrics reach the logs


def test_grpo_single_turn_run_over_an_injected_generator(tmp_path, tokenizer, tiny_model_path):
    stub = StubGenerator(answer(tokenizer))
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, max_steps=1, optim="sgd")
    trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len], args=args,
                                     train_dataset=prompt_dataset(), processing_class=tokenizer)
    assert isinstance(trainer.use_turn_generator(stub), TurnBatchEngine)
    trainer.train()
    assert sorted(stub.keys) == [0, 1, 2, 3] and stub.publications == [1] and stub.closed


def test_an_injected_generator_is_refused_with_trls_own_generation_or_after_the_engine(tmp_path, tokenizer,
                                                                                         tiny_model_path):
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, max_steps=1)
    trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len], args=args,
                                     train_dataset=prompt_dataset(), processing_class=tokenizer,
                                     rollout_func=scripted_rollout_func(tokenizer))
    with pytest.raises(UnsupportedOptionError, match="use_turn_generator: .* rollout_func"):
        trainer.use_turn_generator(StubGenerator())
    trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len], args=args,
                                     train_dataset=prompt_dataset(), processing_class=tokenizer)
    trainer.use_turn_generator(StubGenerator())
    with pytest.raises(UnsupportedOptionError, match="already built its rollout engine"):
        trainer.use_turn_generator(StubGenerator())
    trainer.close()


def test_gkd_run_over_an_injected_generator(tmp_path, tokenizer, tiny_model_path):
    stub = StubGenerator(answer(tokenizer))
    args = ThunderSyncGKDConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False,
                                report_to="none", per_device_train_batch_size=4, max_steps=2, max_new_tokens=10,
                                lmbda=1.0, logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
                                learning_rate=1e-2, optim="sgd", objective="opd")
    trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(tiny_model_path),
                                    args=args, train_dataset=chat_prompts(), processing_class=tokenizer,
                                    environment_factory=CounterEnv)
    assert trainer.use_turn_generator(stub).generator is stub
    trainer.train()
    assert stub.publications == [1, 2] and stub.closed and len(stub.keys) == 2 * 4
    assert trainer.state.log_history[0]["rollout/stub_requests"] == 4.0


class ToolThenAnswer(StubGenerator):
    """Turn 0 calls the environment's tool, turn 1 answers: every trajectory has two turns."""

    def __init__(self, tokenizer) -> None:
        super().__init__(answer(tokenizer))
        call = '<tool_call>\n{"name": "increment", "arguments": {"amount": 2}}\n</tool_call>'
        self.call = tuple(tokenizer.encode(call, add_special_tokens=False) + [tokenizer.eos_token_id])
        self.final = self.answer

    def release(self, key, error=None) -> None:
        self.answer = self.call if key[1] == 0 else self.final
        super().release(key, error)


def test_gkd_scores_each_trajectory_with_one_teacher_request(tmp_path, tokenizer, tiny_model_path):
    """teacher_scoring='trajectory' through the trainer: the per-turn update, one teacher forward per trajectory."""
    from benchmarks.parity import CaptureGrads, relative_error
    from trl_thundersync.tiny.model import save_tiny_model

    teacher_path = save_tiny_model(tmp_path / "teacher", hidden_size=32, num_layers=2, seed=7)  # ≠ the student
    runs = {}
    for scoring in ("turn", "trajectory"):
        stub = ToolThenAnswer(tokenizer)
        capture = CaptureGrads()
        args = ThunderSyncGKDConfig(output_dir=str(tmp_path / scoring), use_cpu=True, bf16=False,
                                    gradient_checkpointing=False, report_to="none", per_device_train_batch_size=4,
                                    max_steps=1, max_new_tokens=48, lmbda=1.0, logging_steps=1, save_strategy="no",
                                    disable_tqdm=True, seed=0, optim="sgd", objective="opd", teacher_scoring=scoring)
        trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                        args=args, train_dataset=chat_prompts(), processing_class=tokenizer,
                                        environment_factory=CounterEnv, callbacks=[capture])
        trainer.use_turn_generator(stub)
        trainer.train()
        assert sorted(stub.keys) == [(i, t) for i in range(4) for t in (0, 1)]  # two turns per trajectory
        runs[scoring] = (capture.directions[0], trainer.state.log_history[0])
    (turn_dir, turn_log), (traj_dir, traj_log) = runs["turn"], runs["trajectory"]
    assert turn_dir.norm() > 0 and relative_error(traj_dir, turn_dir) <= 1e-5
    assert turn_log["thundersync/teacher_requests"] == 8 and traj_log["thundersync/teacher_requests"] == 4
    assert traj_log["thundersync/teacher_prefill_tokens"] == turn_log[
        "thundersync/teacher_prefill_tokens_trajectory_schedule"] < turn_log["thundersync/teacher_prefill_tokens"]
