"""Task suites: one `Suite` record per suite, a registry, and what iterates over it (loading, validation,
held-out evaluation; the tiny agent builds read `Suite.warm_start`).

    from trl_thundersync.envs.suites import Suite, load_suite, register_suite
    suite = load_suite("swe", num_tasks=8)         # "swe" | "terminal" | "lookup" | "thermostat" | yours
    trainer = ThunderSyncGRPOTrainer(..., train_dataset=suite.dataset, environment_factory=suite.environment_factory)

- `record.py`: `Suite` (load, splits, environment, prompt, reference solution, full reward, rows loader, warm
  start) and `WarmStart` (the tiny agent build's transcripts on the suite).
- `swe.py`, `terminal.py`, `lookup.py`, `thermostat.py`: the bundled suites' records (their task data lives in
  `envs/tasks/`, their environments in `envs/environments/`), with the warm-start episodes of lookup and thermostat.
- `registry.py`: `register_suite`, `get_suite`, `suite_names`, `load_suite` (tasks, data set, environment factory).
- `validate.py`: `python -m trl_thundersync.envs.suites.validate`: every task unsolved as shipped, solved by its
  reference.
- `evaluate.py`: `evaluate_suite`, held-out success of a policy (imports torch; not imported here).

A suite of your own: build a `Suite` (tasks with `task_id` and `difficulty`, an environment class with the
`run_shell`/`submit` tools, a prompt, a reference solution) and pass it, or `register_suite` it, wherever a suite
name goes; no library file changes.
"""

from __future__ import annotations

from .record import Suite, WarmStart
from .registry import (
    TaskSuite,
    get_suite,
    load_suite,
    register_suite,
    registered_suites,
    suite_names,
    unregister_suite,
)

__all__ = ["Suite", "TaskSuite", "WarmStart", "get_suite", "load_suite", "register_suite", "registered_suites",
           "suite_names", "unregister_suite"]
