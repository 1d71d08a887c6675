"""Held-out evaluation of a policy on a task suite (a registered name or a `Suite`; the bundled ones with a held-out
split: thermostat, lookup): sampled multi-turn episodes in the sandbox, no training.

    from trl_thundersync.envs.suites.evaluate import evaluate_suite
    result = evaluate_suite(model, tokenizer, "thermostat", split="heldout", samples=4, temperature=0.7)  # SuiteEval

Each episode runs the project's own agent loop (`envs.harness.agent_loop.run_agent_trajectory`) over a fresh
environment of the suite, with Hugging Face `generate` sampling each turn at `temperature` (use the training run's:
the number then measures the policy GRPO trains), in the same turn format as the trainer's rollouts.

    evaluate_suite(model, tokenizer, "thermostat", generator=trainer.evaluation_generator())

With a `generator` (a `rollout.engine.TurnGenerator`: the training run's own rollout engine, e.g. its vLLM servers
at the current policy version) every turn is sampled by it instead, with the run's sampling settings, and the
episodes run concurrently: seconds instead of a sequential `generate` loop. Seeded the same way either way.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import ConfigurationError
from .record import Suite
from .registry import get_suite


@dataclass(frozen=True)
class SuiteEval:
    """Outcome of one evaluation."""

    mean_reward: float  # mean partial-credit reward over every episode
    success: float  # fraction of episodes with the full reward (1.0)
    episodes: int  # tasks x samples
    by_difficulty: dict[str, float]  # difficulty -> success rate


def evaluate_suite(model, tokenizer, suite: str | Suite, *, split: str = "heldout", samples: int = 2, seed: int = 0,
                   temperature: float = 1.0, max_turns: int = 6, max_tokens_per_turn: int = 48,
                   backend: str = "bwrap", generator: Any = None) -> SuiteEval:
    """Sample `samples` episodes per task of `split` and grade them (seeded: the same model gives the same result).
    `generator`: sample every turn with this `TurnGenerator` (its own temperature) instead of `model.generate`."""
    from trl.chat_template_utils import get_training_chat_template

    from ..harness.agent_loop import AgentLimits, ToolRunner, run_agent_trajectory
    from ..harness.tool_calls import ToolResponseRenderer

    if samples < 1 or temperature <= 0:
        raise ConfigurationError(f"evaluate_suite: samples={samples} must be >= 1 and temperature={temperature} > 0")
    record = get_suite(suite)
    tasks, env_class, prompt_of = record.tasks(split), record.environment, record.prompt
    template = get_training_chat_template(tokenizer) or tokenizer.chat_template
    limits = AgentLimits(max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn)
    render = ToolResponseRenderer(tokenizer, template)
    runner = ToolRunner(max_workers=2 if generator is None else 8)

    def generate(context, budget, turn):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator_rng)))
        ids = torch.tensor([list(context)], device=device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget, do_sample=True,
                             temperature=temperature, top_k=0, top_p=1.0, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
        action = tuple(out[0, ids.shape[1]:].tolist())
        return action, (0.0,) * len(action), 0

    def episode(number: int, index: int, task: Any, sample: Callable) -> tuple[str, float]:
        with env_class(tasks={task.task_id: task}, backend=backend) as env:
            env.reset(task_id=task.task_id)
            tools = {"run_shell": env.run_shell, "submit": env.submit}
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt_of(task)}], tools=list(tools.values()),
                chat_template=template, add_generation_prompt=True, tokenize=True, return_dict=True,
            )["input_ids"]
            run_agent_trajectory(index=index, prompt_ids=prompt, tools=tools, generate=sample, tokenizer=tokenizer,
                                 render_tool=render, run_tool=runner, limits=limits, environment=env)
            return task.difficulty, env.get_reward() or 0.0

    episodes = [(index, task) for index, task in enumerate(tasks.values()) for _ in range(samples)]
    if generator is not None:
        return _summary(_episodes_on(generator, episodes, episode, seed, runner))
    generator_rng = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            rewards = [episode(n, index, task, generate) for n, (index, task) in enumerate(episodes)]
    finally:
        runner.close()
        model.train(was_training)
    return _summary(rewards)


def _episodes_on(generator: Any, episodes: list, episode: Callable, seed: int, runner: Any) -> list[tuple[str, float]]:
    """Every episode at once, each turn sampled by `generator` with a seed drawn from (`seed`, episode, turn)."""
    from ...types import RolloutRequest

    def sampler(number: int) -> Callable:
        def sample(context, budget, turn):
            request = RolloutRequest(index=number, group=number, prompt_ids=tuple(context),
                                     seed=(seed * 1_000_003 + number * 1_009 + turn) % (2**31 - 1))
            result = generator.submit(request, key=(("heldout", number), turn), max_new_tokens=budget).result()
            return result.completion_ids, result.sampling_logprobs or (), result.policy_version
        return sample

    try:
        with ThreadPoolExecutor(max_workers=min(16, len(episodes)), thread_name_prefix="heldout") as pool:
            futures = [pool.submit(episode, n, index, task, sampler(n)) for n, (index, task) in enumerate(episodes)]
            return [future.result() for future in futures]
    finally:
        runner.close()


def _summary(rewards: list[tuple[str, float]]) -> SuiteEval:
    levels = sorted({d for d, _ in rewards}, key=("easy", "medium", "hard").index)
    by_difficulty = {d: sum(r == 1.0 for k, r in rewards if k == d) / sum(k == d for k, _ in rewards) for d in levels}
    return SuiteEval(mean_reward=sum(r for _, r in rewards) / len(rewards),
                     success=sum(r == 1.0 for _, r in rewards) / len(rewards), episodes=len(rewards),
                     by_difficulty=by_difficulty)


def evaluate_lookup(model, tokenizer, *, split: str = "heldout", samples: int = 2, seed: int = 0,
                    max_turns: int = 6, max_tokens_per_turn: int = 48, backend: str = "bwrap") -> SuiteEval:
    """`evaluate_suite` on the lookup suite at temperature 1 (the lookup example's)."""
    return evaluate_suite(model, tokenizer, "lookup", split=split, samples=samples, seed=seed, max_turns=max_turns,
                          max_tokens_per_turn=max_tokens_per_turn, backend=backend)
