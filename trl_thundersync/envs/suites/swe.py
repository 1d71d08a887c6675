"""The SWE suite: repair a Python repository until its tests pass (bundled tasks in `envs/tasks/swe/`, or your own
SWE-smith / SWE-bench rows with local checkouts), in `SWERepairEnv`; reward 1.0 when the issue's tests pass."""

from __future__ import annotations

import base64
import shlex
from pathlib import Path

from ..environments.swe import SWERepairEnv
from ..tasks.prompts import swe_prompt
from ..tasks.records import SWETask
from ..tasks.suites import load_swe_suite
from ..tasks.swe_rows import load_swe_rows
from .record import Suite


def overlay_command(solution_dir: Path) -> str:
    """One shell command that writes every file of an overlay directory into the current directory (base64 text
    decoded with `base64 -d`, exactly as an agent could write them)."""
    steps = []
    for path in sorted(p for p in solution_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(solution_dir).as_posix()
        encoded = base64.b64encode(path.read_bytes()).decode()
        parent = Path(rel).parent.as_posix()
        mkdir = f"mkdir -p {shlex.quote(parent)} && " if parent != "." else ""
        steps.append(f"{mkdir}printf %s {encoded} | base64 -d > {shlex.quote(rel)}")
    return " && ".join(steps)


def _solution(task: SWETask) -> tuple[str, ...]:
    return (overlay_command(task.solution_dir),)


def _bundled(split: str):
    return load_swe_suite()  # one split: the bundled tasks


SWE = Suite(
    name="swe", load=_bundled, splits=("train",), environment=SWERepairEnv, prompt=swe_prompt,
    solution=_solution, full_reward=1.0, load_rows=load_swe_rows,
)
