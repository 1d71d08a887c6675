"""Every bundled task is unsolved as shipped and solved by its reference solution, under the real sandbox.

This is the suites' CI proof: `trl_thundersync.envs.suites.validate` grades each task twice (untouched, then
with the reference solution applied through `run_shell`), on a small thread pool; about 20-30 s on two cores.
Run: python -m pytest tests/integration/test_task_suites.py -q
"""

from __future__ import annotations

import os
import shutil

import pytest

from trl_thundersync.envs.suites.validate import validate
from trl_thundersync.envs.tasks import load_swe_suite, load_terminal_suite
from trl_thundersync.envs.tasks.lookup import load_lookup_suite

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
    reason="needs bubblewrap (Debian package `bubblewrap`)",
)


def test_suites_have_the_promised_size() -> None:
    swe, terminal = load_swe_suite(), load_terminal_suite()
    assert len(swe) >= 24 and len(terminal) >= 12
    assert {t.difficulty for t in swe.values()} == {"easy", "medium", "hard"}
    assert sum(t.slow for t in swe.values()) >= 2  # uneven tool time: some test suites sleep on purpose


def test_every_bundled_task_validates() -> None:
    results = validate("all", jobs=4)
    from trl_thundersync.envs.tasks.thermostat import load_thermostat_suite

    lookup = len(load_lookup_suite("train")) + len(load_lookup_suite("heldout"))
    thermostat = len(load_thermostat_suite("train")) + len(load_thermostat_suite("heldout"))
    assert len(results) == len(load_swe_suite()) + len(load_terminal_suite()) + lookup + thermostat
    problems = [f"{r.suite}/{r.task_id} [{r.status}]: {r.message}" for r in results if not r.ok]
    assert not problems, "\n".join(problems)
    assert all(r.noop_reward == 0.0 for r in results if r.suite == "swe")
    assert all(r.solved_reward == 1.5 and r.noop_reward < 1.5 for r in results if r.suite == "terminal")
    assert all(r.solved_reward == 1.0 and r.noop_reward == 0.0 for r in results if r.suite in ("lookup", "thermostat"))
