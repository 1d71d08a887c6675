"""`ThermostatTaskEnv`: the dial tasks of `envs.tasks.thermostat`, with the usual sandboxed `run_shell`/`submit`.

    from trl_thundersync.envs.environments.thermostat import ThermostatTaskEnv
    from trl_thundersync.envs.tasks.thermostat import thermostat_dataset
    trainer = GRPOTrainer(..., train_dataset=thermostat_dataset(), environment_factory=ThermostatTaskEnv)

Commands run in the bubblewrap sandbox over a fresh workspace holding the dial's scripts and its level file, as in
the other suites: the observations are what the scripts print. Grading replays the environment's own record of the
commands `run_shell` executed (and the `submit` call) from the task's start level (`thermostat_reward`), so editing
the level file, or printing "status: ok", changes what the agent reads but not its reward.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from ..runtimes.api import Sandbox
from ..tasks.grading import GradeReport
from ..tasks.thermostat import (
    ThermostatTask,
    final_level,
    load_thermostat_suite,
    thermostat_reward,
)
from .shell_env import ShellTaskEnv

LEVEL_FILE = ".level"  # the dial's state in the workspace (read and written by the scripts)
_STATUS = (  # prints the status line of the level in LEVEL_FILE (envs.tasks.thermostat.STATUS)
    'n=$(cat ' + LEVEL_FILE + ')\n'
    'if [ "$n" -gt 0 ]; then echo "status: high"; elif [ "$n" -lt 0 ]; then echo "status: low"; '
    'else echo "status: ok"; fi\n'
)
_SCRIPTS = {
    "check": _STATUS,
    "up": f'echo $(( $(cat {LEVEL_FILE}) + 1 )) > {LEVEL_FILE}\n' + _STATUS,
    "down": f'echo $(( $(cat {LEVEL_FILE}) - 1 )) > {LEVEL_FILE}\n' + _STATUS,
}


class ThermostatTaskEnv(ShellTaskEnv):
    """Thermostat task environment over a mapping of `ThermostatTask`s (default: the train split). Keyword arguments
    as `ShellTaskEnv` (`limits`, `backend`, `sandbox_factory`, `grade_timeout_s`)."""

    kind = "thermostat"

    def __init__(self, tasks: Mapping[str, ThermostatTask] | Iterable[ThermostatTask] | None = None,
                 **kwargs) -> None:
        super().__init__(tasks, **kwargs)

    def run_shell(self, command: str) -> str:
        """Run a shell command in /workspace and return its exit code and output.

        Args:
            command: The command line, for example "./check", "./up" or "./down".

        Returns:
            The exit code and output of the command.
        """
        return super().run_shell(command)  # recorded in self.actions (ShellTaskEnv), which is graded

    def submit(self) -> str:
        """Finish the task, when the dial says status: ok.

        Returns:
            A confirmation message.
        """
        return super().submit()

    def _default_suite(self) -> Mapping[str, ThermostatTask]:
        return load_thermostat_suite("train")

    def _prepare_workspace(self, workspace: Path) -> None:
        (workspace / LEVEL_FILE).write_text(f"{self.task.start}\n", encoding="utf-8")
        for name, body in _SCRIPTS.items():
            script = workspace / name
            script.write_text("#!/bin/sh\n" + body, encoding="utf-8")
            script.chmod(0o755)

    def _setup_in_sandbox(self, sandbox: Sandbox) -> None:
        return None

    def _grade(self) -> GradeReport:
        reward = thermostat_reward(self.task.start, self.actions)
        level, submitted = final_level(self.task.start, self.actions)
        return GradeReport(reward=reward, detail=f"start {self.task.start:+d}, ended at {level:+d}, "
                                                 f"{'submitted' if submitted else 'not submitted'} "
                                                 f"(did: {self.actions[:8]})")
