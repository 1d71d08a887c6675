"""Prompts and TRL datasets for the task suites (conversational format: a `prompt` list of messages + `task_id`).

`reset(**row)` of the matching environment reads `task_id` and returns None, so the prompt carries the whole task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .records import SWETask, TerminalTask
from .suites import load_swe_suite, load_terminal_suite

if TYPE_CHECKING:
    from datasets import Dataset

WORKDIR = "/workspace"  # where the sandbox mounts the task workspace; the agent's commands start there

_TOOLS_NOTE = (
    "You have two tools. `run_shell(command)` runs a shell command (/bin/sh) in {workdir} and returns its exit "
    "code, stdout and stderr; commands have a time limit and no network. Edit files with shell commands (sed, "
    "python3, cat > file <<'EOF' ...). Call `submit()` once when you are done; nothing you do after it counts."
)


def swe_prompt(task: SWETask) -> str:
    """The user message for a SWE repair task."""
    return (
        f"A Python repository is checked out in {WORKDIR} (your current directory). "
        "Fix the issue below by editing the source code. Tests can be run with `python3 -m pytest -q`. "
        "Do not modify the tests: every test file is restored before grading, and the task is solved only when "
        "the tests for the issue pass and no other test breaks.\n\n"
        + _TOOLS_NOTE.format(workdir=WORKDIR)
        + f"\n\n<issue>\n{task.problem_statement.strip()}\n</issue>"
    )


def terminal_prompt(task: TerminalTask) -> str:
    """The user message for a terminal task."""
    return (
        f"You are working in a Linux shell; your current directory is {WORKDIR}, and all task files are there. "
        "Only standard tools are available (sh, coreutils, grep, sed, awk, find, tar, gzip, python3).\n\n"
        + _TOOLS_NOTE.format(workdir=WORKDIR)
        + f"\n\n<task>\n{task.instruction.strip()}\n</task>"
    )


def swe_dataset(tasks: Mapping[str, SWETask] | Iterable[SWETask] | None = None) -> Dataset:
    """A TRL conversational dataset, one row per SWE task (default: the bundled suite)."""
    chosen = _as_list(load_swe_suite() if tasks is None else tasks)
    return _dataset([(t.task_id, swe_prompt(t)) for t in chosen])


def terminal_dataset(tasks: Mapping[str, TerminalTask] | Iterable[TerminalTask] | None = None) -> Dataset:
    """A TRL conversational dataset, one row per terminal task (default: the bundled suite)."""
    chosen = _as_list(load_terminal_suite() if tasks is None else tasks)
    return _dataset([(t.task_id, terminal_prompt(t)) for t in chosen])


def _as_list(tasks):
    return list(tasks.values()) if isinstance(tasks, Mapping) else list(tasks)


def _dataset(rows: list[tuple[str, str]]) -> Dataset:
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": content}], "task_id": task_id} for task_id, content in rows]
    )
