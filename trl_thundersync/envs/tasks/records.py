"""Frozen task records: what a SWE repair task and a terminal task are, independent of where they were loaded from.

A `SWETask` is a small repository with a bug, a problem statement, and the pytest node ids that decide success
(SWE-bench's FAIL_TO_PASS / PASS_TO_PASS). A `TerminalTask` is an instruction, the files and setup commands that
prepare the workspace, and a pytest verifier file that the agent never sees (it is copied in only at grading).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_TEST_COMMAND = "python3 -m pytest -q -p no:cacheprovider"


@dataclass(frozen=True)
class SWETask:
    """One repository repair task. Starting files come from `repo_dir` (a plain tree or a git checkout)."""

    task_id: str  # unique id; the dataset's `task_id` column selects the task in `reset`
    repo_dir: Path  # host directory holding the starting repository (read only; copied into each workspace)
    problem_statement: str  # the issue text shown to the agent
    fail_to_pass: tuple[str, ...]  # pytest node ids that fail before the fix and must pass after it
    pass_to_pass: tuple[str, ...] = ()  # pytest node ids that pass before the fix and must keep passing
    test_files: tuple[str, ...] = ()  # repo-relative files restored from the grading source before every grade
    test_command: str = DEFAULT_TEST_COMMAND  # pytest invocation; node ids and report flags are appended
    solution_dir: Path | None = None  # overlay of fixed files (repo-relative layout), bundled tasks
    solution_patch: str | None = None  # unified diff of the fix (SWE-bench `patch`), loaded rows
    base_commit: str | None = None  # when set, `repo_dir` is a git checkout and files are exported at this commit
    test_patch: str | None = None  # unified diff adding the grading tests, applied only when grading (SWE-bench)
    difficulty: str = "medium"  # "easy" | "medium" | "hard": a rough label for reports
    slow: bool = False  # True when the tests deliberately take seconds (uneven tool time)

    @property
    def has_reference(self) -> bool:
        return self.solution_dir is not None or self.solution_patch is not None


@dataclass(frozen=True)
class TerminalTask:
    """One terminal task in the SETA / Terminal-Bench style, graded by a hidden pytest verifier."""

    task_id: str  # unique id; the dataset's `task_id` column selects the task in `reset`
    instruction: str  # what the agent must do, shown in the prompt
    verifier_file: Path  # host path of the pytest file; each test is one check (copied in only at grading)
    solution_script: str  # reference solution: a shell script run through `run_shell` by the validator
    files_dir: Path | None = None  # host directory copied into the fresh workspace before the setup commands
    setup: tuple[str, ...] = ()  # shell commands run in the sandbox, in order, to finish preparing the workspace
    difficulty: str = "medium"  # "easy" | "medium" | "hard": a rough label for reports
