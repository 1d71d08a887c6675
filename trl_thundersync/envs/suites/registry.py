"""The registry of task suites, and `load_suite`: the tasks of one run with their data set and environment factory.

    suite = load_suite("thermostat", num_tasks=8)       # a registered name, or a `Suite` record of your own
    trainer = ThunderSyncGRPOTrainer(..., train_dataset=suite.dataset, environment_factory=suite.environment_factory)

    register_suite(my_suite)                             # then "my_suite" works wherever a suite name does

The loaders, the validator (`envs.suites.validate`), held-out evaluation (`envs.suites.evaluate`) and the tiny
agent builds of the examples iterate over this registry; the bundled suites are registered here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError
from .lookup import LOOKUP
from .record import Suite
from .swe import SWE
from .terminal import TERMINAL
from .thermostat import THERMOSTAT

if TYPE_CHECKING:
    from datasets import Dataset

_REGISTRY: dict[str, Suite] = {suite.name: suite for suite in (SWE, TERMINAL, LOOKUP, THERMOSTAT)}


def register_suite(suite: Suite, *, replace: bool = False) -> Suite:
    """Make `suite` reachable by its name (the examples' `--suite`, `validate`, `evaluate_suite`); a name already
    registered is refused unless `replace`. Returns `suite`."""
    if not isinstance(suite, Suite):
        raise ConfigurationError(f"register_suite: expected a Suite record, got {type(suite).__name__}")
    if suite.name in _REGISTRY and _REGISTRY[suite.name] is not suite and not replace:
        raise ConfigurationError(f"a suite named {suite.name!r} is already registered: pass replace=True to replace "
                                 "it, or give yours another name")
    _REGISTRY[suite.name] = suite
    return suite


def unregister_suite(name: str) -> None:
    """Remove the suite registered as `name` (a test's or a user's; a bundled one can be registered again)."""
    if _REGISTRY.pop(name, None) is None:
        raise ConfigurationError(f"no suite named {name!r} is registered")


def suite_names() -> tuple[str, ...]:
    """The registered suites' names, in registration order (the bundled ones first)."""
    return tuple(_REGISTRY)


def registered_suites() -> tuple[Suite, ...]:
    return tuple(_REGISTRY.values())


def get_suite(suite: str | Suite) -> Suite:
    """The registered suite named `suite`; a `Suite` record is returned as it is (registered or not)."""
    if isinstance(suite, Suite):
        return suite
    if suite not in _REGISTRY:
        raise ConfigurationError(f"suite={suite!r} is not one of {suite_names()} (register_suite adds yours)")
    return _REGISTRY[suite]


@dataclass(frozen=True)
class TaskSuite:
    """The tasks of one run and what a trainer needs from them."""

    name: str  # the suite's name
    tasks: Mapping[str, Any]  # task id → task record, in suite order (after num_tasks)
    dataset: Dataset  # one row per task: "prompt" (chat messages) and "task_id" (what the environment's reset gets)
    environment_factory: Callable[[], Any]  # TRL's environment_factory: a fresh sandboxed environment per call


def load_suite(suite: str | Suite, *, num_tasks: int | None = None, split: str | None = None,
               swe_rows: str | None = None, swe_repo_root: str | None = None) -> TaskSuite:
    """The tasks of `suite`'s `split` (default: its training split) — or, for a suite that reads rows (SWE), the
    SWE-smith / SWE-bench style rows in `swe_rows` with local checkouts under `swe_repo_root` — cut to the first
    `num_tasks` when that is given (0 or None: all)."""
    record = get_suite(suite)
    if (swe_rows or swe_repo_root) and record.load_rows is None:
        raise ConfigurationError(f"swe_rows / swe_repo_root are SWE rows; the {record.name} suite has bundled tasks "
                                 "only")
    tasks = record.load_rows(swe_rows, swe_repo_root) if swe_rows else record.tasks(split)
    if num_tasks:
        tasks = dict(list(tasks.items())[:num_tasks])
    return TaskSuite(name=record.name, tasks=tasks, dataset=record.dataset(tasks),
                     environment_factory=functools.partial(record.environment, tasks))
