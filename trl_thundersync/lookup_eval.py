"""Held-out evaluation of a policy on the lookup suite: sampled multi-turn episodes in the sandbox, no training.

    from trl_thundersync.lookup_eval import evaluate_lookup
    result = evaluate_lookup(model, tokenizer, split="heldout", samples=2, seed=0)   # LookupEval

Each episode runs the project's own agent loop (`envs.harness.agent_loop.run_agent_trajectory`) over a fresh
`LookupTaskEnv`, with Hugging Face `generate` sampling each turn (temperature 1, the policy GRPO trains), so the
number measures what training changed, in the same turn format as the trainer's rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .envs.tasks.lookup import LookupSplit, load_lookup_suite, lookup_prompt


@dataclass(frozen=True)
class LookupEval:
    """Outcome of one evaluation."""

    mean_reward: float  # mean partial-credit reward over every episode
    success: float  # fraction of episodes that followed the whole chain (reward 1.0)
    episodes: int  # tasks x samples
    by_difficulty: dict[str, float]  # difficulty -> success rate


def evaluate_lookup(model, tokenizer, *, split: LookupSplit = "heldout", samples: int = 2, seed: int = 0,
                    max_turns: int = 6, max_tokens_per_turn: int = 48, backend: str = "bwrap") -> LookupEval:
    """Sample `samples` episodes per task of `split` and grade them (seeded: the same model gives the same result)."""
    from trl.chat_template_utils import get_training_chat_template

    from .envs.environments.lookup import LookupTaskEnv
    from .envs.harness.agent_loop import AgentLimits, ToolRunner, run_agent_trajectory
    from .envs.harness.tool_calls import ToolResponseRenderer

    template = get_training_chat_template(tokenizer) or tokenizer.chat_template
    tasks = load_lookup_suite(split)
    limits = AgentLimits(max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn)
    render, runner = ToolResponseRenderer(tokenizer, template), ToolRunner(max_workers=2)
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    rewards: list[tuple[str, float]] = []

    def generate(context, budget, turn):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
        ids = torch.tensor([list(context)], device=device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget, do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
        action = tuple(out[0, ids.shape[1]:].tolist())
        return action, (0.0,) * len(action), 0

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for index, task in enumerate(tasks.values()):
                for _ in range(samples):
                    with LookupTaskEnv(tasks={task.task_id: task}, backend=backend) as env:
                        env.reset(task_id=task.task_id)
                        tools = {"run_shell": env.run_shell, "submit": env.submit}
                        prompt = tokenizer.apply_chat_template(
                            [{"role": "user", "content": lookup_prompt(task)}], tools=list(tools.values()),
                            chat_template=template, add_generation_prompt=True, tokenize=True, return_dict=True,
                        )["input_ids"]
                        run_agent_trajectory(index=index, prompt_ids=prompt, tools=tools, generate=generate,
                                             tokenizer=tokenizer, render_tool=render, run_tool=runner, limits=limits,
                                             environment=env)
                        rewards.append((task.difficulty, env.get_reward() or 0.0))
    finally:
        runner.close()
        model.train(was_training)
    by_difficulty = {d: sum(r == 1.0 for k, r in rewards if k == d) / max(1, sum(k == d for k, _ in rewards))
                     for d in ("easy", "medium", "hard")}
    return LookupEval(mean_reward=sum(r for _, r in rewards) / len(rewards),
                      success=sum(r == 1.0 for _, r in rewards) / len(rewards), episodes=len(rewards),
                      by_difficulty=by_difficulty)
