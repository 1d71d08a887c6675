"""Task suites for the agentic environments: records, bundled suites, SWE-bench row loader, TRL datasets.

    from trl_thundersync.envs.tasks import load_swe_suite, swe_dataset, load_swe_rows
"""

from __future__ import annotations

from ..errors import TaskFormatError, TaskSetupError, UnknownTaskError
from .grading import GradeReport, seta_reward, swe_reward
from .prompts import swe_dataset, swe_prompt, terminal_dataset, terminal_prompt
from .records import DEFAULT_TEST_COMMAND, SWETask, TerminalTask
from .suites import load_swe_suite, load_terminal_suite
from .swe_rows import load_swe_rows

__all__ = [
    "DEFAULT_TEST_COMMAND", "GradeReport", "SWETask", "TaskFormatError", "TaskSetupError", "TerminalTask",
    "UnknownTaskError", "load_swe_rows", "load_swe_suite", "load_terminal_suite", "seta_reward", "swe_dataset",
    "swe_prompt", "swe_reward", "terminal_dataset", "terminal_prompt",
]
