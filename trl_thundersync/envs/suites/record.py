"""The `Suite` record: one task suite, as the loaders, the validator, held-out evaluation and the tiny agent build see
it; and `WarmStart`, the tiny agent build's warm start on a suite.

A suite is its task data (`envs/tasks/`), its environment (`envs/environments/`) and one `Suite` record naming both
(`envs/suites/<name>.py`), registered in `envs/suites/registry.py`. A user's own suite is a `Suite` built in the
user's code: pass it where a suite name goes (`load_suite`, `evaluate_suite`, `validate`) or `register_suite` it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError

if TYPE_CHECKING:
    from datasets import Dataset


@dataclass(frozen=True)
class WarmStart:
    """The tiny agent build's warm start on one suite (`tiny.agent.save_tiny_agent_model(warm_start=...)`)."""

    suite: str  # the suite's name
    prompt: str  # the user message of every warm-start transcript on the suite
    tools: Callable[[], Sequence[Callable]]  # the suite environment's tools: the transcripts' system block is then
    #   the one its rollouts show
    episode: Callable[[random.Random], list[dict]]  # one synthetic episode after the prompt (assistant tool calls,
    #   tool results, a final message), in the chat template's message format
    share: float | None  # share of the warm-start steps on the suite, one draw per step (the others: generic tool
    #   use); None: every step, without a draw
    key: Mapping[str, Any]  # what the build's warm_start.json records of it: a folder is reused only under this key
    hidden_size: int = 64  # the width of the tiny model this warm start was tuned for


@dataclass(frozen=True)
class Suite:
    """One task suite: where its tasks come from, the environment they run in, and what each consumer needs."""

    name: str  # the `--suite` value and the registry key
    load: Callable[[str], Mapping[str, Any]]  # split -> {task id: task}, in suite order; a task has `task_id` and
    #   `difficulty` ("easy" | "medium" | "hard")
    splits: tuple[str, ...]  # the splits `load` accepts; the first one is what training uses
    environment: Callable[..., Any]  # the environment class (TRL `environment_factory`): `environment(tasks,
    #   **sandbox keywords)`, `reset(task_id=...)`, the `run_shell` / `submit` tools, `get_reward`, `infra_error`
    prompt: Callable[[Any], str]  # task -> the user message of its episode (the data set's one prompt message)
    solution: Callable[[Any], tuple[str, ...]]  # task -> the reference solution's `run_shell` commands, in order
    #   (validation: applied, then `submit`)
    full_reward: float  # what a solved task earns (validation: the reference solution gets it, the untouched task
    #   less)
    load_rows: Callable[[str, str | None], Mapping[str, Any]] | None = None  # (rows file, checkouts root) -> the
    #   user's own tasks in the suite's format (SWE-smith / SWE-bench rows); None: the bundled tasks only
    warm_start: Callable[..., WarmStart] | None = None  # (suite-specific options) -> the tiny agent build's warm
    #   start on it; None: the suite has none
    tiny_agent: str | None = None  # the examples' model name (and folder) of the tiny agent warm-started on it

    def __post_init__(self) -> None:
        if not self.name or not self.splits:
            raise ConfigurationError(f"Suite(name={self.name!r}, splits={self.splits!r}): both must be non-empty")
        if not self.full_reward > 0:
            raise ConfigurationError(f"Suite {self.name!r}: full_reward={self.full_reward} must be > 0")
        if self.tiny_agent is not None and self.warm_start is None:
            raise ConfigurationError(f"Suite {self.name!r}: tiny_agent={self.tiny_agent!r} names the build of its "
                                     "warm start, and warm_start is None")

    def tasks(self, split: str | None = None) -> Mapping[str, Any]:
        """The tasks of `split` (default: the training split, the first of `splits`)."""
        split = self.splits[0] if split is None else split
        if split not in self.splits:
            raise ConfigurationError(f"suite {self.name!r} has no split {split!r}: its splits are {self.splits}")
        return self.load(split)

    def dataset(self, tasks: Mapping[str, Any] | None = None) -> Dataset:
        """A TRL conversational data set, one row per task (default: the training split): `prompt` (one user
        message) and `task_id` (what the environment's `reset` reads)."""
        from datasets import Dataset

        chosen = list((self.tasks() if tasks is None else tasks).values())
        return Dataset.from_list([{"prompt": [{"role": "user", "content": self.prompt(t)}], "task_id": t.task_id}
                                  for t in chosen])
