"""Shared by the agent-loop tests: typed tool functions with Google-style docstrings (TRL turns them into schemas)
and the observation spans of a trajectory's env_mask."""

from __future__ import annotations


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return a + b


def echo(text: str) -> str:
    """Echo a text.

    Args:
        text: what to return
    """
    return text


def observation_spans(traj) -> list[tuple[int, int]]:
    """[start, end) of every run of environment tokens (env_mask 0) in a trajectory's completion."""
    spans, start = [], None
    for i, m in enumerate(traj.env_mask + [1]):
        if m == 0 and start is None:
            start = i
        if m == 1 and start is not None:
            spans.append((start, i))
            start = None
    return spans


def replay_rollout_func(batches, steps_per_batch: int = 1):
    """A TRL `rollout_func` that hands stock `trl.GRPOTrainer` the trajectories ThunderSync sampled: `batches[k]` is
    generation batch k's (rollout, reward) pairs, served at global step k·steps_per_batch with their prompt and
    completion ids, sampler log-probs, env_mask, and the reward as the extra column `env_reward` reads."""
    by_step = {steps_per_batch * k: {r.index: (r, reward) for r, reward in pairs} for k, pairs in enumerate(batches)}

    def rollout_func(prompts, trl_trainer):
        rs = [by_step[trl_trainer.state.global_step][i] for i in range(len(prompts))]
        return {"prompt_ids": [list(r.prompt_ids) for r, _ in rs],
                "completion_ids": [list(r.completion_ids) for r, _ in rs],
                "logprobs": [list(r.sampling_logprobs) for r, _ in rs], "env_mask": [list(r.env_mask) for r, _ in rs],
                "env_reward": [reward for _, reward in rs]}

    return rollout_func


def env_reward(env_reward, **kwargs):
    """The reward `replay_rollout_func` replays (its `env_reward` column)."""
    return env_reward
