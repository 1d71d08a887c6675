"""`grading_workers` end to end: the trainer grades environments concurrently and trains what serial grading trains."""

from __future__ import annotations

import threading

import pytest
import torch

from benchmarks.parity import cpu_config, load_model, relative_error
from benchmarks.scripted import ScriptedTurnGenerator
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

pytestmark = pytest.mark.slow

BATCH = 4  # cpu_config: 4 rows, groups of 2


def flat(model):
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def barrier_counter_env(barrier: threading.Barrier | None):
    """tests.integration.test_agentic_trainer's CounterEnv whose get_reward needs `barrier`'s parties at once."""
    from tests.fixtures.agentic_trainer import CounterEnv

    class GatedCounterEnv(CounterEnv):
        def get_reward(self) -> float:
            if barrier is not None:
                barrier.wait(timeout=30)  # a serial grader breaks it (BrokenBarrierError) instead of hanging
            return super().get_reward()

    GatedCounterEnv.__name__ = "CounterEnv"  # the same reward column in both runs
    return GatedCounterEnv


@pytest.mark.parametrize("scope, release", [("trajectory", "content"), ("batch", "content"), ("group", "reward")])
def test_concurrent_grading_trains_what_serial_grading_trains(scope, release, tmp_path, tokenizer, tiny_model_path):
    from tests.fixtures.agentic_trainer import dataset, script

    initial = flat(load_model(tiny_model_path))
    params, logged = {}, {}
    for workers in (1, BATCH):
        env = barrier_counter_env(threading.Barrier(BATCH) if workers > 1 else None)
        args = cpu_config(ThunderSyncGRPOConfig, tmp_path / str(workers), max_steps=2, max_completion_length=256,
                          agent_protocol="paper", agent_max_turns=4, optim="sgd", reward_scope=scope,
                          release=release, grading_workers=workers)
        trainer = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[], args=args,
                                         train_dataset=dataset(), processing_class=tokenizer,
                                         environment_factory=env)
        trainer.use_turn_generator(ScriptedTurnGenerator(tokenizer, script,
                                                         delay=lambda i, t: 0.002 * ((7 * i + t) % 5)))
        trainer.train()
        params[workers], logged[workers] = flat(trainer.model), trainer._logs["rewards"]["CounterEnv"]
    assert list(logged[BATCH]) == list(logged[1])
    # the same update; only the learner's summation order may follow a different arrival order (FP32 rounding)
    assert relative_error(params[BATCH] - initial, params[1] - initial) < 1e-5
    assert not [t for t in threading.enumerate() if t.name.startswith("thundersync-grading")]


@pytest.mark.parametrize("scope", ["trajectory", "batch"])
def test_a_get_reward_that_raises_stops_training_before_any_step_naming_it(scope, tmp_path, tokenizer,
                                                                           tiny_model_path):
    from tests.fixtures.agentic_trainer import CounterEnv, dataset, script
    from trl_thundersync.errors import RewardFunctionError

    calls, lock = [], threading.Lock()

    class CrashingEnv(CounterEnv):
        def get_reward(self) -> float:
            with lock:
                calls.append(self)
                third = len(calls) == 3
            if third:  # the third grading of the first batch, whichever trajectory that is
                raise RuntimeError("pytest crashed")
            return super().get_reward()

    CrashingEnv.__name__ = "CounterEnv"
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, max_steps=2, max_completion_length=256, agent_protocol="paper",
                      agent_max_turns=4, optim="sgd", reward_scope=scope, grading_workers=BATCH)
    model = load_model(tiny_model_path)
    initial = flat(model)
    trainer = ThunderSyncGRPOTrainer(model=model, reward_funcs=[], args=args, train_dataset=dataset(),
                                     processing_class=tokenizer, environment_factory=CrashingEnv)
    trainer.use_turn_generator(ScriptedTurnGenerator(tokenizer, script))
    with pytest.raises(RewardFunctionError, match=r"reward function 'CounterEnv' raised RuntimeError: pytest crashed "
                                                  r"on trajectory \d+ \(group \d+\)"):
        trainer.train()
    assert trainer.state.global_step == 0 and torch.equal(flat(trainer.model), initial)
    assert not [t for t in threading.enumerate() if t.name.startswith("thundersync-grading")]
