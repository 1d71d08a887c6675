"""A suite of the user's own plugs in without editing the library: a `Suite` record defined here (its tasks, an
environment, a prompt, a reference solution) runs through the loader, the examples' `--suite` flag, held-out
evaluation and validation, passed as a record or registered by name.

The environment runs commands with the unsandboxed local fallback (no bubblewrap needed); the episodes of the
evaluation are played by a scripted turn generator (no trained model).
Run: python -m pytest tests/unit/envs/suites/test_own_suite.py -q
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.scripted import ScriptedTurnGenerator, tool_call_text
from trl_thundersync.envs.environments.shell_env import ShellTaskEnv
from trl_thundersync.envs.runtimes.local import LocalSubprocessSandbox
from trl_thundersync.envs.suites import Suite, get_suite, load_suite, register_suite, suite_names, unregister_suite
from trl_thundersync.envs.suites.evaluate import evaluate_suite
from trl_thundersync.envs.suites.validate import validate
from trl_thundersync.envs.tasks.grading import GradeReport
from trl_thundersync.errors import ConfigurationError

pytestmark = pytest.mark.sandbox


@dataclass(frozen=True)
class EchoTask:
    task_id: str
    secret: int  # written to secret.txt; the answer is that number in answer.txt
    difficulty: str = "easy"


TASKS = {"train": {f"echo-{n}": EchoTask(f"echo-{n}", n) for n in (3, 5, 8)},
         "heldout": {f"echo-held-{n}": EchoTask(f"echo-held-{n}", n) for n in (13, 21)}}


class EchoEnv(ShellTaskEnv):
    """Copy the number in secret.txt into answer.txt, then submit."""

    kind = "echo"

    def __init__(self, tasks=None, **kwargs) -> None:
        if kwargs.get("sandbox_factory") is None:
            kwargs["sandbox_factory"] = LocalSubprocessSandbox
        super().__init__(tasks, **kwargs)

    def _default_suite(self):
        return TASKS["train"]

    def _prepare_workspace(self, workspace: Path) -> None:
        (workspace / "secret.txt").write_text(f"{self.task.secret}\n")

    def _setup_in_sandbox(self, sandbox) -> None:
        return None

    def _grade(self) -> GradeReport:
        answer = self.workspace / "answer.txt"
        right = answer.is_file() and answer.read_text().strip() == str(self.task.secret)
        return GradeReport(reward=1.0 if right else 0.0, detail=f"answer.txt right: {right}")


def echo_suite(name: str = "echo", solution=lambda task: ("cat secret.txt > answer.txt",)) -> Suite:
    return Suite(name=name, load=lambda split: TASKS[split], splits=("train", "heldout"), environment=EchoEnv,
                 prompt=lambda task: "Copy the number in secret.txt into answer.txt, then call submit().",
                 solution=solution, full_reward=1.0)


def test_the_loader_gives_tasks_a_data_set_and_an_environment_factory() -> None:
    suite = load_suite(echo_suite(), num_tasks=2)
    assert suite.name == "echo" and list(suite.tasks) == ["echo-3", "echo-5"]
    assert [row["task_id"] for row in suite.dataset] == ["echo-3", "echo-5"]
    assert suite.dataset[0]["prompt"] == [{"role": "user", "content": echo_suite().prompt(None)}]
    env = suite.environment_factory()
    assert isinstance(env, EchoEnv) and env._task_map() == suite.tasks and suite.environment_factory() is not env
    with env:
        env.reset(task_id="echo-5")
        assert env.run_shell("cat secret.txt").endswith("5")
        env.run_shell("echo 5 > answer.txt")
        env.submit()
        assert env.get_reward() == 1.0
    assert list(load_suite(echo_suite(), split="heldout").tasks) == list(TASKS["heldout"])
    with pytest.raises(ConfigurationError, match="no split 'test'"):
        load_suite(echo_suite(), split="test")
    with pytest.raises(ConfigurationError, match="swe_rows"):
        load_suite(echo_suite(), swe_rows="rows.jsonl")


def test_a_registered_suite_is_reachable_by_name_also_from_the_examples_flag() -> None:
    from trl import TrlParser

    from trl_thundersync.examples_support.arguments import SuiteArguments

    suite = register_suite(echo_suite())
    try:
        assert "echo" in suite_names() and get_suite("echo") is suite
        with pytest.raises(ConfigurationError, match="already registered"):
            register_suite(echo_suite())
        (args,) = TrlParser((SuiteArguments,)).parse_args_and_config(["--suite", "echo", "--num_tasks", "1"])
        assert list(args.load_suite().tasks) == ["echo-3"] and args.tiny_model_dir == "tiny-agent"
        assert [r.status for r in validate("echo", ["echo-8"])] == ["ok"]
    finally:
        unregister_suite("echo")
    assert "echo" not in suite_names()
    with pytest.raises(ConfigurationError, match="suite='echo'"):
        get_suite("echo")


def test_validation_grades_the_untouched_task_and_the_reference_solution() -> None:
    results = validate(echo_suite(), jobs=2)
    assert [(r.suite, r.task_id) for r in results] == [("echo", t) for split in TASKS.values() for t in split]
    assert all(r.status == "ok" and r.noop_reward == 0.0 and r.solved_reward == 1.0 for r in results), results
    wrong = validate(echo_suite(solution=lambda task: ("echo 0 > answer.txt",)), ["echo-3"])
    assert [r.status for r in wrong] == ["fail"] and "expected 1.0" in wrong[0].message


def _copy_the_secret(index: int, turn: int, context: str) -> str:
    if turn == 0:
        return tool_call_text("run_shell", {"command": "cat secret.txt"})
    if turn == 1:
        secret = re.findall(r"stdout:\s*(\d+)", context)[-1]
        return tool_call_text("run_shell", {"command": f"echo {secret} > answer.txt"})
    return tool_call_text("submit", {})


def test_held_out_evaluation_runs_the_suites_episodes(tokenizer) -> None:
    solver = ScriptedTurnGenerator(tokenizer, _copy_the_secret)
    try:
        result = evaluate_suite(None, tokenizer, echo_suite(), split="heldout", samples=2, generator=solver)
    finally:
        solver.close()
    assert (result.episodes, result.success, result.mean_reward, result.by_difficulty) == (4, 1.0, 1.0, {"easy": 1.0})
    idle = ScriptedTurnGenerator(tokenizer, lambda index, turn, context: tool_call_text("submit", {}))
    try:
        assert evaluate_suite(None, tokenizer, echo_suite(), samples=1, generator=idle).success == 0.0
    finally:
        idle.close()


def test_a_suite_record_refuses_what_no_consumer_could_use() -> None:
    with pytest.raises(ConfigurationError, match="splits"):
        Suite(name="echo", load=TASKS.get, splits=(), environment=EchoEnv, prompt=str, solution=tuple, full_reward=1.0)
    with pytest.raises(ConfigurationError, match="full_reward"):
        Suite(name="echo", load=TASKS.get, splits=("train",), environment=EchoEnv, prompt=str, solution=tuple,
              full_reward=0.0)
    with pytest.raises(ConfigurationError, match="warm_start is None"):
        Suite(name="echo", load=TASKS.get, splits=("train",), environment=EchoEnv, prompt=str, solution=tuple,
              full_reward=1.0, tiny_agent="tiny-agent-echo")
