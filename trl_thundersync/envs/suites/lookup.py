"""The lookup suite: follow a chain of pointers through the sandbox (`envs/tasks/lookup.py`), in `LookupTaskEnv`;
partial credit, held-out chains never trained on. Its tiny agent (`tiny-agent-lookup`) is warm-started on
`lookup_episode`s."""

from __future__ import annotations

import functools
import itertools
import random

from ...errors import ConfigurationError
from ..environments.lookup import LookupTaskEnv
from ..tasks.lookup import (
    DECOYS,
    LOOKUP_INSTRUCTION,
    POINTERS,
    START,
    SUBMIT,
    LookupTask,
    load_lookup_suite,
    lookup_prompt,
)
from .record import Suite, WarmStart
from .transcripts import environment_tools, shell_result, submitted, tool_call

LOOKUP_SHARE = 1.0  # share of the lookup build's warm-start steps on the lookup suite (the others: tool use)
# The lookup build (issue 15 probes, 300 steps on 2 cores; BENCHMARKS.md "Issue 15"): at width 64 the warm start
# never learned to copy a pointer (teacher-forced p(named directory) stayed at chance even with every episode
# following); at 128 with every episode following it did in one of three builds (this one: seed 0, the suite's
# directory names; held-out success 0.46); with 40-50% following, in none.
LOOKUP_HIDDEN = 128  # width of the lookup example's model
LOOKUP_FOLLOW = 1.0  # share of the lookup warm start's episodes that follow their pointers (`lookup_episode`)


def lookup_episode(rng: random.Random, follow: bool = False) -> list[dict]:
    """An episode in the lookup suite's format: `cat input.txt`, then shell commands drawn from the suite's
    pointers, then submit, with observations shaped as the suite's sandbox prints them.

    `follow=False` teaches the format only: each command is independent of what the observation before it named, so
    such a policy follows a chain only by chance. `follow=True` teaches the skill: a chain of 1-3 distinct hops that
    is not a held-out multi-hop chain (`lookup_warm_chains`), each command the one the previous observation named,
    submit when it names submit — the warm start mixes both (`follow`) so RL starts from a policy that sometimes
    succeeds and has the conditioning to amplify."""
    choices = (*POINTERS, SUBMIT)
    if follow:
        chain = rng.choice(lookup_warm_chains())
        shown, commands = (*chain, SUBMIT), chain
    else:
        commands = []
        for _ in range(rng.randint(1, 4)):
            command = rng.choice(choices)
            if command == SUBMIT:
                break
            commands.append(command)
        shown = tuple(rng.choice(choices) for _ in range(len(commands) + 1))
    messages = _read_input(rng, shown[0])
    for command, pointer in zip(commands, shown[1:], strict=True):
        listing = sorted([f"next: {pointer}", *rng.sample(DECOYS, rng.randint(0, 2))])
        messages += [tool_call("run_shell", {"command": command}), shell_result("\n".join(listing))]
    messages += [tool_call("submit", {}), submitted()]
    messages.append({"role": "assistant", "content": rng.choice(("Done.", "Submitted."))})
    return messages


def _read_input(rng: random.Random, pointer: str) -> list[dict]:
    """The episode's first call and what it shows: `cat input.txt` naming `pointer` (with the suite's wordings)."""
    text = rng.choice(("", "Start here.\n", "Follow the pointers.\n")) + f"next: {pointer}"
    return [tool_call("run_shell", {"command": START}), shell_result(text)]


@functools.cache
def lookup_warm_chains() -> tuple[tuple[str, ...], ...]:
    """The chains a following warm-start episode may walk: every chain of 1-3 distinct pointers except the held-out
    split's multi-hop chains, so held-out success on those measures generalization, not recall."""
    held = {t.chain for t in load_lookup_suite("heldout").values() if len(t.chain) > 1}
    return tuple(c for n in (1, 2, 3) for c in itertools.permutations(POINTERS, n) if c not in held)


def lookup_warm_start(follow: float = LOOKUP_FOLLOW, share: float = LOOKUP_SHARE) -> WarmStart:
    """A `share` of the warm-start steps draw the suite's prompt and `lookup_episode`s, each of which follows its
    pointers with probability `follow` (0: the format only); 128 wide (LOOKUP_HIDDEN)."""
    for name, value in (("lookup_follow", follow), ("lookup_share", share)):
        if not 0.0 <= value <= 1.0:
            raise ConfigurationError(f"{name}={value} is not a probability in [0, 1]")

    def episode(rng: random.Random) -> list[dict]:
        return lookup_episode(rng, follow=rng.random() < follow)

    return WarmStart(suite="lookup", prompt=LOOKUP_INSTRUCTION, tools=lambda: environment_tools(LookupTaskEnv),
                     episode=episode, share=share,
                     key={"lookup": True, "lookup_follow": follow, "lookup_share": share}, hidden_size=LOOKUP_HIDDEN)


def _solution(task: LookupTask) -> tuple[str, ...]:
    return task.solution_commands  # several commands, each through run_shell, in order


LOOKUP = Suite(
    name="lookup", load=load_lookup_suite, splits=("train", "heldout"), environment=LookupTaskEnv,
    prompt=lookup_prompt, solution=_solution, full_reward=1.0, warm_start=lookup_warm_start,
    tiny_agent="tiny-agent-lookup",
)
