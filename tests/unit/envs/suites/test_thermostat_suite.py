"""The thermostat suite (envs/tasks/thermostat.py), its environment and its warm start: partial credit, an
observation-blind policy stays low, the reactive rule solves every split, the grade cannot be forged.

The no-op-fails / reference-passes validation of every task runs in tests/integration/test_task_suites.py.
"""

from __future__ import annotations

import json
import random
import shutil
from itertools import product

import pytest

from trl_thundersync.envs.suites import get_suite, load_suite, suite_names
from trl_thundersync.envs.suites.thermostat import THERMOSTAT_FOLLOW, thermostat_episode
from trl_thundersync.envs.tasks.thermostat import (
    CHECK,
    DOWN,
    SUBMIT,
    UP,
    chance_reward,
    final_level,
    load_thermostat_suite,
    status_line,
    thermostat_reward,
)
from trl_thundersync.errors import ConfigurationError

TRAIN, HELDOUT = load_thermostat_suite("train"), load_thermostat_suite("heldout")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (Debian package `bubblewrap`)")


def reactive_run(start: int) -> list[str]:
    """What the rule does, reading each status the scripts would print: the suite's solution, then submit."""
    level, actions = start, [CHECK]
    while level != 0:
        actions.append(DOWN if level > 0 else UP)
        level += 1 if actions[-1] == UP else -1
    return [*actions, SUBMIT]


def test_partial_credit_is_progress_and_finishing() -> None:
    assert thermostat_reward(2, [CHECK, DOWN, DOWN, SUBMIT]) == 1.0
    assert thermostat_reward(2, [CHECK, DOWN, DOWN]) == 0.5  # at the target, never submitted
    assert thermostat_reward(2, [CHECK, DOWN, SUBMIT]) == 0.25  # half way, submitted early
    assert thermostat_reward(-1, [UP, UP, SUBMIT]) == 0.0  # overshot: as far as at the start
    assert thermostat_reward(-2, [DOWN, SUBMIT]) == 0.0  # the wrong way
    assert thermostat_reward(1, [SUBMIT]) == 0.0 and thermostat_reward(1, []) == 0.0
    assert thermostat_reward(1, [CHECK, " ./down ", SUBMIT, UP]) == 1.0  # whitespace; nothing counts after submit
    assert thermostat_reward(1, ["./down; ./up", "echo status: ok", SUBMIT]) == 0.0  # only the exact commands move
    assert final_level(3, [UP, DOWN, DOWN]) == (2, False)


def test_splits_are_disjoint_and_held_out_tasks_start_farther() -> None:
    assert set(TRAIN).isdisjoint(HELDOUT)
    assert {t.start for t in TRAIN.values()} == {1, -1, 2, -2}
    assert {t.start for t in HELDOUT.values()} == {3, -3, 4, -4}
    assert {t.difficulty for t in TRAIN.values()} == {"easy", "medium"}
    assert {t.difficulty for t in HELDOUT.values()} == {"hard"}
    assert sum(t.start > 0 for t in TRAIN.values()) == len(TRAIN) // 2  # as many above as below the target
    with pytest.raises(ConfigurationError, match="split"):
        load_thermostat_suite("test")


def test_the_reactive_rule_solves_every_task_and_a_blind_policy_does_not() -> None:
    """The signal is the association observation -> command: the rule (the suite's reference) scores 1.0 on both
    splits, while the best fixed command sequence (every one up to 5 moves) stays at or below 0.32 on train and
    0.5 on held-out — no length or format shortcut reaches the rule."""
    for task in (*TRAIN.values(), *HELDOUT.values()):
        assert thermostat_reward(task.start, reactive_run(task.start)) == 1.0
        assert (*task.solution_commands, SUBMIT) == tuple(reactive_run(task.start))
    blind = [[CHECK, *moves, SUBMIT] for n in range(6) for moves in product((UP, DOWN), repeat=n)]
    assert max(chance_reward(TRAIN, seq) for seq in blind) <= 0.32
    assert max(chance_reward(HELDOUT, seq) for seq in blind) <= 0.5


def test_the_suite_is_selectable_by_name() -> None:
    assert "thermostat" in suite_names()
    suite = load_suite("thermostat")
    assert set(suite.tasks) == set(TRAIN) and len(suite.dataset) == len(TRAIN)
    assert suite.dataset[0]["prompt"][0]["role"] == "user" and suite.dataset[0]["task_id"] in TRAIN


def test_warm_start_episodes_follow_the_dynamics_and_the_rule_when_asked() -> None:
    """Every episode's observations are what the scripts print for the level its actions reached from some train
    start; with follow=1 the episode is the reference run; with follow=0 the commands ignore the observations
    (both directions, and submit, occur after "status: high")."""
    rng = random.Random(0)
    after_high = set()
    for follow in (0.0, 1.0):
        for _ in range(200):
            episode = thermostat_episode(rng, follow=follow)
            calls = [m["tool_calls"][0]["function"] for m in episode if m.get("tool_calls")]
            assert {c["name"] for c in calls} <= {"run_shell", "submit"}
            actions = [c["arguments"]["command"] if c["name"] == "run_shell" else SUBMIT for c in calls]
            shown = [m["content"].rsplit("\n", 1)[-1] for m in episode if m.get("name") == "run_shell"]
            starts = [s for s in (1, -1, 2, -2) if _statuses(s, actions) == shown]
            assert actions[0] == CHECK and starts, (actions, shown)
            if follow == 1.0:
                assert any(actions == reactive_run(s) for s in starts)
            elif len(actions) > 1 and shown[0] == "status: high":
                after_high.add(actions[1])
    assert {UP, DOWN, SUBMIT} <= after_high


def test_the_teacher_warm_start_follows_the_rule_from_every_distance_asked() -> None:
    """`distances` sets the start levels an episode is drawn from (the distillation teacher: train and held-out);
    with follow=1 each is the reference run from its start."""
    rng, starts_seen = random.Random(1), set()
    for _ in range(200):
        episode = thermostat_episode(rng, follow=1.0, distances=(3, 4))
        calls = [m["tool_calls"][0]["function"] for m in episode if m.get("tool_calls")]
        actions = [c["arguments"]["command"] if c["name"] == "run_shell" else SUBMIT for c in calls]
        shown = [m["content"].rsplit("\n", 1)[-1] for m in episode if m.get("name") == "run_shell"]
        starts = [s for s in (3, -3, 4, -4) if _statuses(s, actions) == shown and actions == reactive_run(s)]
        assert len(starts) == 1, (actions, shown)
        starts_seen.add(starts[0])
    assert starts_seen == {3, -3, 4, -4}


def _statuses(start: int, actions: list[str]) -> list[str]:
    """The status line each run_shell action prints, from `start`."""
    level, out = start, []
    for action in actions:
        if action == SUBMIT:
            break
        level += {UP: 1, DOWN: -1}.get(action, 0)
        out.append(status_line(level))
    return out


def test_the_thermostat_build_key_names_its_follow_share(tmp_path, monkeypatch) -> None:
    from trl_thundersync.tiny import agent

    calls = []
    monkeypatch.setattr(agent, "warm_start", lambda *a, **k: calls.append(k) or [1.0, 0.5])
    thermostat = get_suite("thermostat").warm_start
    path = agent.save_tiny_agent_model(tmp_path / "agent", steps=2, suite=thermostat())
    record = json.loads((path / agent.MARKER).read_text())
    assert record["thermostat"] is True and record["thermostat_follow"] == THERMOSTAT_FOLLOW
    assert calls[-1]["suite"].key["thermostat_follow"] == THERMOSTAT_FOLLOW and calls[-1]["suite"].suite == "thermostat"
    agent.save_tiny_agent_model(path, steps=2, suite=thermostat())
    assert len(calls) == 1, "same key: reused"
    agent.save_tiny_agent_model(path, steps=2)
    assert len(calls) == 2 and calls[-1]["suite"] is None, "the default build is another folder"
    with pytest.raises(ConfigurationError, match="thermostat_follow"):
        agent.save_tiny_agent_model(path, steps=2, suite=thermostat(follow=2.0))
    with pytest.raises(ConfigurationError, match="suite='both'"):  # one suite per build: a name, not a set of flags
        agent.save_tiny_agent_model(path, steps=2, suite=get_suite("both").warm_start())
    teacher = agent.save_tiny_agent_model(tmp_path / "teacher", steps=2, suite=thermostat(follow=1.0,
                                                                                         distances=(1, 2, 3, 4)))
    assert json.loads((teacher / agent.MARKER).read_text())["thermostat_distances"] == [1, 2, 3, 4]
    assert calls[-1]["suite"].key["thermostat_distances"] == [1, 2, 3, 4]
    agent.save_tiny_agent_model(teacher, steps=2, suite=thermostat(follow=1.0))
    assert len(calls) == 4 and "thermostat_distances" not in calls[-1]["suite"].key, "other distances: rebuilt"
    with pytest.raises(ConfigurationError, match="thermostat_distances"):
        agent.save_tiny_agent_model(path, steps=2, suite=thermostat(distances=(0, 2)))
    with pytest.raises(ConfigurationError, match="thermostat_distances"):
        agent.save_tiny_agent_model(path, steps=2, suite=thermostat(distances=()))


@needs_bwrap
def test_environment_runs_the_dial_in_the_sandbox_and_grades_its_own_record() -> None:
    """The scripts print the status of the level the commands reached; writing the level file or printing
    'status: ok' changes what the agent reads, not what it is graded on; nothing runs after submit."""
    from trl_thundersync.envs.environments.thermostat import ThermostatTaskEnv

    task = next(t for t in HELDOUT.values() if t.start == 3)
    with ThermostatTaskEnv(tasks=HELDOUT) as env:
        env.reset(task_id=task.task_id)
        assert env.run_shell(CHECK).endswith("status: high")
        assert env.run_shell(DOWN).endswith("status: high")
        assert env.run_shell("echo 0 > .level; ./check").endswith("status: ok")  # forged in the workspace
        env.submit()
        assert env.run_shell(DOWN).startswith("The task was already submitted")
        assert env.get_reward() == pytest.approx(0.5 * 1 / 3)  # graded: one step down of three, not at target
        env.reset(task_id=task.task_id)
        for command in (CHECK, DOWN, DOWN, DOWN):
            observation = env.run_shell(command)
        assert observation.endswith("status: ok")
        env.submit()
        assert env.get_reward() == 1.0 and env.actions == [CHECK, DOWN, DOWN, DOWN, SUBMIT]
