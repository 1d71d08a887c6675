"""Environments: TRL `environment_factory` classes whose public methods are the model's tools.

- `shell_env.py`: `ShellTaskEnv`, the shell-task base (a fresh workspace and sandbox per episode, the `run_shell`
  and `submit` tools, reward caching, infrastructure errors as None rewards).
- `pytest_graded.py`: `PytestGradedEnv`, grading one attempt with one pytest run in a fresh grading copy.
- `swe.py`: `SWERepairEnv` (repair a repository until its tests pass); `terminal.py`: `TerminalTaskEnv` (shell
  tasks graded by a hidden verifier).
- `lookup.py`, `thermostat.py`: `LookupTaskEnv`, `ThermostatTaskEnv` (graded from the environment's own record of
  the commands it ran).

They run commands through a `runtimes` sandbox and read their tasks from `tasks` (records, suites, grading); the
`suites` layer above names each with its tasks (`envs/suites/`) and validates them.
"""

from __future__ import annotations

from .pytest_graded import PytestGradedEnv
from .shell_env import ShellTaskEnv
from .swe import SWERepairEnv
from .terminal import TerminalTaskEnv

__all__ = ["PytestGradedEnv", "SWERepairEnv", "ShellTaskEnv", "TerminalTaskEnv"]
