"""The terminal suite (SETA / Terminal-Bench style): shell tasks graded by a hidden pytest verifier (bundled in
`envs/tasks/terminal/`), in `TerminalTaskEnv`; reward p + 0.5·[p = 1], p the share of checks passed."""

from __future__ import annotations

from ..environments.terminal import TerminalTaskEnv
from ..tasks.prompts import terminal_prompt
from ..tasks.records import TerminalTask
from ..tasks.suites import load_terminal_suite
from .record import Suite


def _solution(task: TerminalTask) -> tuple[str, ...]:
    return (task.solution_script,)  # solution.sh, passed to run_shell as one command


def _bundled(split: str):
    return load_terminal_suite()  # one split: the bundled tasks


TERMINAL = Suite(
    name="terminal", load=_bundled, splits=("train",), environment=TerminalTaskEnv,
    prompt=terminal_prompt, solution=_solution, full_reward=1.5,
)
