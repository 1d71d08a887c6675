"""The "thermostat" suite: steer a sandboxed dial to its target, one reading at a time — a task family a tiny agent
learns on CPU within minutes (issue 15; the quickstart example's task).

Each workspace holds three executable scripts and a hidden level (an integer, 0 is the target):

    ./check     prints the status: "status: high" (level > 0), "status: low" (< 0) or "status: ok" (= 0)
    ./down      lowers the level by one, then prints the new status
    ./up        raises the level by one, then prints the new status

The agent starts blind: the prompt is the same for every task, so only the tool results say which way to go. The
policy that solves every task is reactive — high → `./down`, low → `./up`, ok → `submit()` — and each of those
decisions is one association between the last observation and the next command, a skill a 64-wide model can learn
from reward alone. Tasks start 1 or 2 steps from the target (easy / medium; train split) or 3 or 4 (hard; the
held-out split: longer episodes than any trained on, solvable only by the reactive rule, not by a memorized
sequence).

Reward (partial credit; graded from the environment's own record of the commands it ran, never from a file the agent
could write): half for progress — the fraction of the start's distance to the target the agent removed, 0 if it
ended as far or farther — and half for finishing — the level at the target when `submit()` is called. Commands
after submit are not run. A policy that submits at once scores 0; one that ignores every observation (a fixed
sequence) scores `chance_reward`, which is low on the train split because levels above and below the target are
equally common.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from ...errors import ConfigurationError

if TYPE_CHECKING:
    from datasets import Dataset

ThermostatSplit = Literal["train", "heldout"]
CHECK, DOWN, UP = "./check", "./down", "./up"  # the three shell commands that act on the dial
SUBMIT = "submit"  # the `submit` tool, recorded among the actions
MOVES = {UP: 1, DOWN: -1}  # command -> change of the level
STATUS = {1: "status: high", -1: "status: low", 0: "status: ok"}  # sign of the level -> what the scripts print
_DIFFICULTY = {1: "easy", 2: "medium", 3: "hard", 4: "hard"}
TRAIN_DISTANCES, HELDOUT_DISTANCES = (1, 2), (3, 4)
_TRAIN_COPIES = 4  # task ids per train start level (every copy is the same dial: more rows, the same task)

THERMOSTAT_INSTRUCTION = (
    "A dial in /workspace is off target. Run ./check to read it. While it says status: high, run ./down; while it "
    "says status: low, run ./up; when it says status: ok, call submit(). One run_shell call per command."
)


@dataclass(frozen=True)
class ThermostatTask:
    """One start level of the dial."""

    task_id: str  # unique id; the dataset's `task_id` column selects the task in `reset`
    start: int  # the hidden level at reset (never 0)
    difficulty: str  # "easy" | "medium" | "hard" (|start| 1, 2, 3-4)

    @property
    def solution_commands(self) -> tuple[str, ...]:
        """The reference run: check, then |start| moves toward 0 (then `submit`)."""
        return (CHECK, *([DOWN if self.start > 0 else UP] * abs(self.start)))


def status_line(level: int) -> str:
    return STATUS[(level > 0) - (level < 0)]


def final_level(start: int, actions: Sequence[str]) -> tuple[int, bool]:
    """(level when the episode ended, whether it ended with submit). `actions`: run_shell commands and "submit"."""
    level = start
    for action in actions:
        if action == SUBMIT:
            return level, True
        level += MOVES.get(" ".join(action.split()), 0)
    return level, False


def thermostat_reward(start: int, actions: Sequence[str]) -> float:
    """Partial credit of one episode (see the module docstring)."""
    level, submitted = final_level(start, actions)
    progress = max(0, abs(start) - abs(level)) / abs(start)
    return 0.5 * progress + 0.5 * float(submitted and level == 0)


def chance_reward(tasks: Mapping[str, ThermostatTask], actions: Sequence[str]) -> float:
    """Mean reward of one fixed action sequence over `tasks` (a policy that ignores every observation)."""
    return sum(thermostat_reward(t.start, actions) for t in tasks.values()) / max(1, len(tasks))


@functools.cache
def load_thermostat_suite(split: ThermostatSplit = "train") -> Mapping[str, ThermostatTask]:
    """The tasks of `split`, keyed by task id, easy first (deterministic; read-only mapping, cached). Train: start
    levels ±1 and ±2, `_TRAIN_COPIES` ids each; held-out: ±3 and ±4, one id each."""
    if split not in ("train", "heldout"):
        raise ConfigurationError(f"thermostat split={split!r} is not 'train' or 'heldout'")
    distances, copies = (TRAIN_DISTANCES, _TRAIN_COPIES) if split == "train" else (HELDOUT_DISTANCES, 1)
    tasks: dict[str, ThermostatTask] = {}
    for distance in distances:
        for sign, name in ((1, "high"), (-1, "low")):
            for copy in range(copies):
                task = ThermostatTask(task_id=f"thermostat-{split}-{name}{distance}-{copy}", start=sign * distance,
                                      difficulty=_DIFFICULTY[distance])
                tasks[task.task_id] = task
    return MappingProxyType(tasks)


def thermostat_prompt(task: ThermostatTask | None = None) -> str:
    """The user message (the same for every task: the level is only in the sandbox)."""
    return THERMOSTAT_INSTRUCTION


def thermostat_dataset(tasks: Mapping[str, ThermostatTask] | None = None) -> Dataset:
    """A TRL conversational dataset, one row per task (default: the train split; TRL's sampler shuffles it)."""
    from datasets import Dataset

    chosen = list((load_thermostat_suite() if tasks is None else tasks).values())
    return Dataset.from_list([{"prompt": [{"role": "user", "content": thermostat_prompt(t)}],
                               "task_id": t.task_id} for t in chosen])
