"""The "lookup" suite: follow a chain of pointers through the sandbox — a task family a tiny agent can learn on CPU.

Why this family: the bundled SWE and terminal tasks need code edits a 64-wide model never produces, so GRPO on them
sees reward 0 everywhere and nothing to learn from. Here every action is a short shell command the tiny agent can
emit, yet the right one is only knowable from the previous tool result:

    /workspace/input.txt         "next: ls tests"        (the start: the agent must `cat input.txt`)
    /workspace/tests/            "next: ls logs", decoy files
    /workspace/logs/             "next: submit", decoy files

The agent must run `cat input.txt`, then the command each observation names, in order, then `submit`. Chains are
1-3 directory hops (easy / medium / hard), so groups of one prompt get different rewards as the policy improves.

Reward (partial credit, shortcuts score 0): the first command must be `cat input.txt`, else 0. After it, the chain's
steps (each named command, then `submit`) are compared with what the agent did next, in order; the reward is the
number of steps matched before the first mismatch, over the number of steps. Reading the file earns nothing by itself,
so a policy that only emits the format (calls tools, submits) or reads and then submits scores 0; a fixed guess
succeeds only on the tasks whose chain it happens to name (the chance baseline, `chance_reward`).

Splits: "train" and "heldout" are disjoint in task ids and in their files' decoys and wording; for 2 and 3 hops they
are also disjoint in chains (a held-out chain is never trained on).
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from ...errors import ConfigurationError

if TYPE_CHECKING:
    from datasets import Dataset

LookupSplit = Literal["train", "heldout"]
START = "cat input.txt"  # the first command of every solution: the tool call whose result the policy must use
SUBMIT = "submit"  # the last step of every chain (the `submit` tool, not a shell command)
DIRECTORIES = ("data", "tests", "notes", "logs")  # every workspace has all four, each holding one pointer file
POINTERS = tuple(f"ls {d}" for d in DIRECTORIES)  # the commands a chain can name
DECOYS = ("README", "old.txt", "todo.md", "a.csv", "b.csv", "log1", "log2", "spec.json", "draft", "x.py")
_DIFFICULTY = {1: "easy", 2: "medium", 3: "hard"}
_HELDOUT_SEED, _TRAIN_SEED = 15_001, 15_000
_TRAIN_COPIES = {1: 4, 2: 1, 3: 1}  # variants (decoys, wording) per chain: keeps the three depths about balanced


@dataclass(frozen=True)
class LookupTask:
    """One pointer chain and the files that encode it."""

    task_id: str  # unique id; the dataset's `task_id` column selects the task in `reset`
    chain: tuple[str, ...]  # the commands input.txt and each listing name, in order (each one of POINTERS)
    files: tuple[tuple[str, str], ...]  # (workspace-relative path, text) written into the fresh workspace
    difficulty: str  # "easy" | "medium" | "hard" (1, 2, 3 hops)

    @property
    def steps(self) -> tuple[str, ...]:
        """What must follow `cat input.txt`: the named commands, then submit."""
        return (*self.chain, SUBMIT)

    @property
    def solution_commands(self) -> tuple[str, ...]:
        """The reference run: every shell command, in order (then `submit`)."""
        return (START, *self.chain)


def normalize(command: str) -> str:
    """A command as the grader compares it: whitespace collapsed, a trailing slash on the directory dropped."""
    text = " ".join(command.split())
    return text[:-1] if text.endswith("/") and text.startswith("ls ") else text


def lookup_reward(steps: Sequence[str], actions: Sequence[str]) -> float:
    """Partial credit of one episode. `actions`: the agent's run_shell commands and "submit", in order."""
    actions = [normalize(a) for a in actions]
    if not actions or actions[0] != START:
        return 0.0
    matched = 0
    for expected, done in zip(steps, actions[1:], strict=False):
        if done != expected:
            break
        matched += 1
    return matched / len(steps)


def chance_reward(tasks: Mapping[str, LookupTask], actions: Sequence[str]) -> float:
    """Mean reward of one fixed action sequence over `tasks` (a policy that ignores every observation)."""
    return sum(lookup_reward(t.steps, actions) for t in tasks.values()) / max(1, len(tasks))


def _task(chain: tuple[str, ...], split: str, variant: int, rng: random.Random) -> LookupTask:
    """The files of `chain`: input.txt names the first hop; each visited directory names the next (the last one
    names submit); directories off the chain point somewhere random, so visiting them blindly does not help."""
    targets = {chain[i].split()[1]: (chain[i + 1] if i + 1 < len(chain) else SUBMIT) for i in range(len(chain))}
    files = [("input.txt", rng.choice(("", "Start here.\n", "Follow the pointers.\n")) + f"next: {chain[0]}\n")]
    for directory in DIRECTORIES:
        pointer = targets.get(directory) or rng.choice((*POINTERS, SUBMIT))
        files.append((f"{directory}/next: {pointer}", ""))
        for decoy in rng.sample(DECOYS, rng.randint(0, 2)):
            files.append((f"{directory}/{decoy}", "nothing here\n"))
    hops = "-".join(c.split()[1] for c in chain)
    return LookupTask(task_id=f"lookup-{split}-{hops}-{variant}", chain=chain, files=tuple(files),
                      difficulty=_DIFFICULTY[len(chain)])


def _chains(depth: int) -> list[tuple[str, ...]]:
    return list(itertools.permutations(POINTERS, depth))


@functools.cache
def load_lookup_suite(split: LookupSplit = "train") -> Mapping[str, LookupTask]:
    """The lookup tasks of `split`, keyed by task id, easy first (deterministic; read-only mapping, cached).

    Held out: one variant of every 1-hop chain, 3 of the 12 two-hop chains, 6 of the 24 three-hop chains (every
    fourth, in a fixed order); train: the rest, 1-hop chains in several variants."""
    if split not in ("train", "heldout"):
        raise ConfigurationError(f"lookup split={split!r} is not 'train' or 'heldout'")
    rng = random.Random(_TRAIN_SEED if split == "train" else _HELDOUT_SEED)
    tasks: dict[str, LookupTask] = {}
    for depth in (1, 2, 3):
        for index, chain in enumerate(_chains(depth)):
            held = depth == 1 or index % 4 == 3
            if split == "heldout" and held:
                task = _task(chain, split, 0, rng)
                tasks[task.task_id] = task
            elif split == "train" and (depth == 1 or not held):
                for variant in range(_TRAIN_COPIES[depth]):
                    task = _task(chain, split, variant, rng)
                    tasks[task.task_id] = task
    return MappingProxyType(tasks)


LOOKUP_INSTRUCTION = (
    "The file input.txt in /workspace (your current directory) names the next command to run, as `next: "
    "<command>`. Run `cat input.txt` first; then run exactly the command each output names (a directory listing "
    "holds one file called `next: <command>`), one tool call each, in order, until it says `next: submit`; then "
    "call `submit()`. Use the run_shell tool for every command."
)


def lookup_prompt(task: LookupTask | None = None) -> str:
    """The user message (the same for every task: the chain is only in the files)."""
    return LOOKUP_INSTRUCTION


def lookup_dataset(tasks: Mapping[str, LookupTask] | None = None) -> Dataset:
    """A TRL conversational dataset, one row per task (default: the train split)."""
    from datasets import Dataset

    chosen = list((load_lookup_suite() if tasks is None else tasks).values())
    return Dataset.from_list([{"prompt": [{"role": "user", "content": lookup_prompt(t)}], "task_id": t.task_id}
                              for t in chosen])
