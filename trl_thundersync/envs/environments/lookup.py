"""`LookupTaskEnv`: the pointer-chain tasks of `envs.tasks.lookup`, with the usual sandboxed `run_shell`/`submit`.

    from trl_thundersync.envs.environments.lookup import LookupTaskEnv
    from trl_thundersync.envs.tasks.lookup import lookup_dataset
    trainer = GRPOTrainer(..., train_dataset=lookup_dataset(), environment_factory=LookupTaskEnv)

Commands run in the bubblewrap sandbox over a fresh workspace holding the task's files, exactly as in the other
suites. Grading needs no verifier run: the reward (`lookup_reward`) is a function of what the agent did, in order —
the commands `run_shell` executed and the `submit` call — which the environment records itself; nothing the agent
writes or prints can change that record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from ..runtimes.api import Sandbox
from ..tasks.grading import GradeReport
from ..tasks.lookup import LookupTask, load_lookup_suite, lookup_reward
from .shell_env import ShellTaskEnv


class LookupTaskEnv(ShellTaskEnv):
    """Lookup task environment over a mapping of `LookupTask`s (default: the train split). Keyword arguments as
    `ShellTaskEnv` (`limits`, `backend`, `sandbox_factory`, `grade_timeout_s`)."""

    kind = "lookup"

    def __init__(self, tasks: Mapping[str, LookupTask] | Iterable[LookupTask] | None = None, **kwargs) -> None:
        super().__init__(tasks, **kwargs)

    def run_shell(self, command: str) -> str:
        """Run a shell command in the task workspace (/workspace) and return its exit code and output.

        Args:
            command: The command line, run with /bin/sh -c in /workspace, for example "cat input.txt" or "ls data".

        Returns:
            The exit code, stdout and stderr of the command; long output is shortened in the middle.
        """
        return super().run_shell(command)  # recorded in self.actions (ShellTaskEnv), which is graded

    def submit(self) -> str:
        """Finish the task. Call this once, when the last output says `next: submit`; no command runs after it.

        Returns:
            A confirmation message.
        """
        return super().submit()

    def _default_suite(self) -> Mapping[str, LookupTask]:
        return load_lookup_suite("train")

    def _prepare_workspace(self, workspace: Path) -> None:
        for rel, text in self.task.files:
            path = workspace / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")

    def _setup_in_sandbox(self, sandbox: Sandbox) -> None:
        return None

    def _grade(self) -> GradeReport:
        reward = lookup_reward(self.task.steps, self.actions)
        matched = round(reward * len(self.task.steps))
        return GradeReport(reward=reward, detail=f"{matched}/{len(self.task.steps)} chain steps followed "
                                                 f"(chain: {' -> '.join(self.task.steps)}; did: {self.actions[:8]})")
