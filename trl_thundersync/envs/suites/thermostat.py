"""The thermostat suite: steer a sandboxed dial to its target (`envs/tasks/thermostat.py`), in `ThermostatTaskEnv`;
partial credit, held-out tasks start farther from the target than any trained on (the quickstart's task). Its tiny
agent (`tiny-agent-thermostat`) is warm-started on `thermostat_episode`s."""

from __future__ import annotations

import random

from ...errors import ConfigurationError
from ..environments.thermostat import ThermostatTaskEnv
from ..tasks.thermostat import (
    CHECK,
    DOWN,
    MOVES,
    SUBMIT,
    THERMOSTAT_INSTRUCTION,
    TRAIN_DISTANCES,
    UP,
    ThermostatTask,
    load_thermostat_suite,
    status_line,
    thermostat_prompt,
)
from .record import Suite, WarmStart
from .transcripts import environment_tools, shell_result, submitted, tool_call

# The thermostat build (issue 15; BENCHMARKS.md "Time to quality"): width 64, 300 steps, every episode a thermostat
# one, half of its actions the reactive rule's. With no following (0.0) RL at lr 1e-3 lost the tool-call format
# within 3 steps; with a quarter, the reward rose more slowly than this build's within the quickstart's budget.
THERMOSTAT_FOLLOW = 0.5  # share of the thermostat warm start's actions that follow the rule (`thermostat_episode`)


def thermostat_episode(rng: random.Random, follow: float = 0.0,
                       distances: tuple[int, ...] | None = None) -> list[dict]:
    """An episode in the thermostat suite's format: `./check`, then up to 5 actions, each the reactive rule's
    (high → ./down, low → ./up, ok → submit) with probability `follow`, else one of the three drawn uniformly; every
    observation is what the dial's scripts print for the level the actions so far reached (from a start level
    `distances` away from the target; default: the train split's). `follow=0` teaches the format and the dynamics
    only: the commands ignore the observations, so such a policy solves a task by chance, and RL has the association
    to learn. `follow=1` from every distance (train and held-out) is a policy that has the skill: the distillation
    benchmark's teacher."""
    level = rng.choice(distances or TRAIN_DISTANCES) * rng.choice((1, -1))
    messages = [tool_call("run_shell", {"command": CHECK}), shell_result(status_line(level))]
    for _ in range(5):
        right = SUBMIT if level == 0 else (DOWN if level > 0 else UP)
        action = right if rng.random() < follow else rng.choice((UP, DOWN, SUBMIT))
        if action == SUBMIT:
            messages += [tool_call("submit", {}), submitted()]
            break
        level += MOVES[action]
        messages += [tool_call("run_shell", {"command": action}), shell_result(status_line(level))]
    messages.append({"role": "assistant", "content": rng.choice(("Done.", "Submitted."))})
    return messages


def thermostat_warm_start(follow: float = THERMOSTAT_FOLLOW, distances: tuple[int, ...] | None = None) -> WarmStart:
    """Every warm-start step draws the suite's prompt and `thermostat_episode(follow=follow, distances=distances)`s
    (a `follow` share of the actions the reactive rule's, from start levels `distances` away; default: the train
    split's)."""
    if not 0.0 <= follow <= 1.0:
        raise ConfigurationError(f"thermostat_follow={follow} is not a probability in [0, 1]")
    if distances is not None and not (distances and all(isinstance(d, int) and d > 0 for d in distances)):
        raise ConfigurationError(f"thermostat_distances={distances!r} must be positive integers")
    key = {"thermostat": True, "thermostat_follow": follow,
           **({"thermostat_distances": list(distances)} if distances else {})}
    return WarmStart(suite="thermostat", prompt=THERMOSTAT_INSTRUCTION,
                     tools=lambda: environment_tools(ThermostatTaskEnv),
                     episode=lambda rng: thermostat_episode(rng, follow, distances), share=None, key=key)


def _solution(task: ThermostatTask) -> tuple[str, ...]:
    return task.solution_commands  # several commands, each through run_shell, in order


THERMOSTAT = Suite(
    name="thermostat", load=load_thermostat_suite, splits=("train", "heldout"), environment=ThermostatTaskEnv,
    prompt=thermostat_prompt, solution=_solution, full_reward=1.0, warm_start=thermostat_warm_start,
    tiny_agent="tiny-agent-thermostat",
)
