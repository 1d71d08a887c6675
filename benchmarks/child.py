"""Start one benchmark run in its own process (peak RSS per run, no state shared between runs); no torch import here,
so the parent that interleaves the runs stays light.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# The repository root: `benchmarks` is run from a checkout, not installed.
REPO_ROOT = Path(__file__).resolve().parents[1]


def spawn_run(module: str, flag: str, spec: dict, run_dir: Path, log_name: str, what: str) -> dict:
    """Run `python -m module flag <spec JSON>` in its own process, output to `run_dir/log_name`; its result JSON."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / log_name
    with log.open("w") as f:
        proc = subprocess.run([sys.executable, "-m", module, flag, json.dumps(spec)], stdout=f,
                              stderr=subprocess.STDOUT, env=child_environment())
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed with exit code {proc.returncode}; log {log}:\n{log.read_text()[-3000:]}")
    result = json.loads((run_dir / "result.json").read_text())
    result["log"] = str(log)
    return result


def child_environment() -> dict[str, str]:
    """This process's environment with the repository root first on PYTHONPATH, so `python -m benchmarks.X` resolves
    from any working directory."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
