"""The lookup suite (envs/tasks/lookup.py): partial credit, shortcuts score 0, disjoint splits, files encode chains.

The sandboxed part (no-op fails / reference passes through the environment's tools) is in
tests/integration/test_task_suites.py and in `test_environment_grades_what_ran` below (bubblewrap, skipped without).
"""

from __future__ import annotations

import shutil
from itertools import product

import pytest

from trl_thundersync.envs.suites import get_suite, load_suite, suite_names
from trl_thundersync.envs.suites.lookup import LOOKUP_SHARE, lookup_episode, lookup_warm_chains
from trl_thundersync.envs.tasks.lookup import (
    POINTERS,
    START,
    SUBMIT,
    chance_reward,
    load_lookup_suite,
    lookup_reward,
    normalize,
)

TRAIN, HELDOUT = load_lookup_suite("train"), load_lookup_suite("heldout")


def test_partial_credit_counts_chain_steps_until_the_first_mismatch() -> None:
    steps = ("ls tests", "ls logs", SUBMIT)
    assert lookup_reward(steps, [START, "ls tests", "ls logs", SUBMIT]) == 1.0
    assert lookup_reward(steps, [START, "ls tests", "ls logs"]) == pytest.approx(2 / 3)  # never submitted
    assert lookup_reward(steps, [START, "ls tests", "ls data", "ls logs", SUBMIT]) == pytest.approx(1 / 3)
    assert lookup_reward(steps, [START, " ls  tests/ ", "ls logs", SUBMIT]) == 1.0  # whitespace, trailing slash
    assert normalize("ls  data/") == "ls data"


@pytest.mark.parametrize("actions", [
    [],  # no tool call
    [SUBMIT],  # the format only: submit straight away
    [START, SUBMIT],  # reads the pointer, then ignores it
    ["ls", START, "ls tests", "ls logs", SUBMIT],  # anything before reading: not the task
    ["ls tests", "ls logs", SUBMIT],  # the right hops without reading (a memorized chain)
    [START, START, "ls tests", "ls logs", SUBMIT],  # repeating the read is a wrong step
])
def test_shortcuts_score_zero(actions) -> None:
    assert lookup_reward(("ls tests", "ls logs", SUBMIT), actions) == 0.0


def test_an_observation_blind_policy_stays_at_chance() -> None:
    """Every fixed sequence of up to 3 hops (a policy that never uses what the tools returned) earns far less than
    following the pointers: the best one scores under 0.2 on either split."""
    for tasks in (TRAIN, HELDOUT):
        blind = [(START, *hops, SUBMIT) for n in range(4) for hops in product(POINTERS, repeat=n)]
        assert max(chance_reward(tasks, a) for a in blind) < 0.2
        assert chance_reward(tasks, [START]) == 0.0 and chance_reward(tasks, [SUBMIT]) == 0.0


def test_splits_are_disjoint_and_spread_over_difficulties() -> None:
    assert not set(TRAIN) & set(HELDOUT)
    multi_hop = lambda tasks: {t.chain for t in tasks.values() if len(t.chain) > 1}  # noqa: E731
    assert not multi_hop(TRAIN) & multi_hop(HELDOUT)  # a held-out 2-3 hop chain is never trained on
    for tasks in (TRAIN, HELDOUT):
        assert {t.difficulty for t in tasks.values()} == {"easy", "medium", "hard"}
    assert len(TRAIN) >= 40 and len(HELDOUT) >= 12
    assert load_lookup_suite("train") is TRAIN  # cached, deterministic


def test_files_encode_exactly_the_chain() -> None:
    """input.txt names the first hop; each visited directory holds one pointer file naming the next step."""
    for task in (*TRAIN.values(), *HELDOUT.values()):
        files = dict(task.files)
        assert files["input.txt"].endswith(f"next: {task.chain[0]}\n")
        for hop, following in zip(task.chain, task.steps[1:], strict=True):
            directory = hop.split()[1]
            pointers = [p for p in files if p.startswith(f"{directory}/next: ")]
            assert pointers == [f"{directory}/next: {following}"]


def test_the_suite_is_selectable_by_name() -> None:
    assert "lookup" in suite_names()
    suite = load_suite("lookup", num_tasks=3)
    assert list(suite.tasks) == list(TRAIN)[:3] and set(suite.dataset["task_id"]) == set(list(TRAIN)[:3])
    assert "cat input.txt" in suite.dataset[0]["prompt"][0]["content"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (Debian package `bubblewrap`)")
def test_environment_grades_what_ran() -> None:
    """In the sandbox: the reference run earns 1.0, a blind guess and reading-then-submitting earn what the reward
    says, and a command refused after submit is not recorded."""
    from trl_thundersync.envs.environments.lookup import LookupTaskEnv

    task = next(t for t in HELDOUT.values() if len(t.chain) == 2)
    with LookupTaskEnv(tasks=HELDOUT) as env:
        env.reset(task_id=task.task_id)
        assert f"next: {task.chain[0]}" in env.run_shell(START)
        assert f"next: {task.chain[1]}" in env.run_shell(task.chain[0])
        assert "next: submit" in env.run_shell(task.chain[1])
        env.submit()
        env.run_shell("ls")  # refused: after submit
        assert env.actions == [START, *task.chain, SUBMIT] and env.get_reward() == 1.0
        env.reset(task_id=task.task_id)
        env.run_shell(START)
        env.submit()
        assert env.get_reward() == 0.0
        env.reset(task_id=task.task_id)
        env.run_shell(START)
        env.run_shell(task.chain[0])
        env.run_shell(next(p for p in POINTERS if p != task.chain[1]))
        env.submit()
        assert env.get_reward() == pytest.approx(1 / 3)


def test_the_lookup_warm_start_teaches_the_format_not_the_chain(tmp_path) -> None:
    """Its episodes always read input.txt first, but the hop after an observation is drawn independently of what
    the observation named (so RL has the conditioning to learn); its build key differs from the default one."""
    import json
    import random

    from trl_thundersync.tiny import agent

    rng = random.Random(0)
    followed = []
    for _ in range(400):
        episode = lookup_episode(rng)
        assert episode[0]["tool_calls"][0]["function"]["arguments"]["command"] == START
        shown = episode[1]["content"].split("next: ")[1].split("\n")[0]
        call = episode[2]["tool_calls"][0]["function"]
        followed.append((call["arguments"].get("command") if call["name"] == "run_shell" else SUBMIT) == shown)
    assert 0.1 < sum(followed) / len(followed) < 0.3  # chance: 1 in 5
    path = agent.save_tiny_agent_model(tmp_path / "agent", steps=2, suite=get_suite("lookup").warm_start())
    assert json.loads((path / agent.MARKER).read_text())["lookup"] is True


def _walk(episode: list[dict]) -> tuple[list[str], list[str]]:
    """(what each observation named, what the agent did next) over one warm-start episode."""
    shown, done = [], []
    for message, reply in zip(episode, episode[1:], strict=False):
        if message["role"] == "tool" and message["name"] == "run_shell":
            shown.append(message["content"].split("next: ")[1].split("\n")[0])
            call = reply["tool_calls"][0]["function"]
            done.append(call["arguments"]["command"] if call["name"] == "run_shell" else SUBMIT)
    return shown, done


def test_following_warm_start_episodes_walk_a_trained_chain() -> None:
    """follow=True: every command is the one the previous observation named, submit when it names submit, and the
    walked chain is never a held-out multi-hop chain (held-out success on those stays a generalization measure)."""
    import random


    held = {t.chain for t in HELDOUT.values() if len(t.chain) > 1}
    assert held and not held & set(lookup_warm_chains())
    assert {len(c) for c in lookup_warm_chains()} == {1, 2, 3}
    rng = random.Random(1)
    walked = set()
    for _ in range(300):
        episode = lookup_episode(rng, follow=True)
        shown, done = _walk(episode)
        assert episode[0]["tool_calls"][0]["function"]["arguments"]["command"] == START
        assert done == shown and done[-1] == SUBMIT and SUBMIT not in done[:-1]
        walked.add(tuple(done[:-1]))
    assert not walked & held and {len(c) for c in walked} == {1, 2, 3}


def test_the_lookup_build_key_names_its_follow_share(tmp_path, monkeypatch) -> None:
    import json

    from trl_thundersync.errors import ConfigurationError
    from trl_thundersync.tiny import agent

    calls = []
    monkeypatch.setattr(agent, "warm_start", lambda *a, **k: calls.append(k) or [1.0, 0.5])
    lookup = get_suite("lookup").warm_start
    path = agent.save_tiny_agent_model(tmp_path / "agent", steps=2, suite=lookup(follow=0.3))
    record = json.loads((path / agent.MARKER).read_text())
    assert (record["lookup_follow"], record["lookup_share"]) == (0.3, LOOKUP_SHARE)
    assert (calls[-1]["suite"].key["lookup_follow"], calls[-1]["suite"].share) == (0.3, LOOKUP_SHARE)
    agent.save_tiny_agent_model(path, steps=2, suite=lookup(follow=0.3))
    assert len(calls) == 1, "same key: reused"
    agent.save_tiny_agent_model(path, steps=2, suite=lookup(follow=0.5))
    assert len(calls) == 2, "another follow share: rebuilt"
    for bad, flag in (({"follow": 1.5}, "lookup_follow"), ({"share": -0.1}, "lookup_share")):
        with pytest.raises(ConfigurationError, match=flag):
            agent.save_tiny_agent_model(path, steps=2, suite=lookup(**bad))
