"""Task environments: episode lifecycle, tool surface, grading integrity, infrastructure errors, SWE-bench rows.

Environment tests run every command under the real bubblewrap sandbox (skipped where `bwrap` is missing, unless CI
sets THUNDERSYNC_REQUIRE_SANDBOX=1); the pure helpers, the loaders and the tool surface need no sandbox.
Run: python -m pytest tests/unit/envs/environments/test_task_envs.py -q
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import typing
from pathlib import Path

import pytest

from trl_thundersync.envs.environments.swe import SWERepairEnv
from trl_thundersync.envs.environments.terminal import TerminalTaskEnv
from trl_thundersync.envs.runtimes.api import CommandResult, Sandbox, SandboxError, SandboxLimits
from trl_thundersync.envs.runtimes.local import LocalSubprocessSandbox
from trl_thundersync.envs.suites.swe import overlay_command
from trl_thundersync.envs.tasks import (
    SWETask,
    TaskFormatError,
    TaskSetupError,
    TerminalTask,
    UnknownTaskError,
    load_swe_rows,
    load_swe_suite,
    load_terminal_suite,
    seta_reward,
    swe_dataset,
    swe_reward,
    terminal_dataset,
)

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
    reason="needs bubblewrap (Debian package `bubblewrap`)",
)

SLUG = "slugify_separators"  # a bundled SWE task with one module and one test file
LIMITS = SandboxLimits(timeout_s=20.0)


@pytest.fixture
def slug_env():
    with SWERepairEnv(limits=LIMITS) as env:
        env.reset(task_id=SLUG, prompt=[{"role": "user", "content": "..."}])
        yield env


def shell_ok(env, command: str) -> str:
    observation = env.run_shell(command)
    assert env.last_result is not None and env.last_result.ok, observation
    return observation


# ---------------------------------------------------------------- tool surface (TRL's rule: public methods are tools)


@pytest.mark.parametrize("env_class", [SWERepairEnv, TerminalTaskEnv])
def test_tools_are_run_shell_and_submit_with_docstrings_and_hints(env_class) -> None:
    from transformers.utils import get_json_schema

    from trl_thundersync.rollout.agent_engine import environment_tools

    env = env_class()
    tools = environment_tools(env)
    assert sorted(tool.__name__ for tool in tools) == ["run_shell", "submit"]
    for tool in tools:
        doc = inspect.getdoc(tool)
        assert doc and "Returns:" in doc
        hints = typing.get_type_hints(tool)
        assert hints.pop("return") is str
        assert all(hints[name] is str for name in inspect.signature(tool).parameters)
        assert get_json_schema(tool)["function"]["name"] == tool.__name__  # what TRL renders into the prompt
    assert "Args:" in inspect.getdoc(env.run_shell) and "command" in inspect.signature(env.run_shell).parameters
    assert callable(env.close) and not inspect.isfunction(inspect.getattr_static(env_class, "close"))
    assert env.done is False


# ---------------------------------------------------------------- episode lifecycle


@needs_bwrap
def test_reset_gives_a_fresh_workspace_each_time(slug_env: SWERepairEnv) -> None:
    first = slug_env.workspace
    assert shell_ok(slug_env, "pwd").splitlines()[-1] == "/workspace"
    shell_ok(slug_env, "echo scribble > note.txt && rm textkit.py")
    slug_env.submit()
    assert slug_env.done and slug_env.num_commands == 2

    slug_env.reset(task_id=SLUG)
    second = slug_env.workspace
    assert second != first and not first.exists()
    assert (second / "textkit.py").is_file() and not (second / "note.txt").exists()
    assert (slug_env.done, slug_env.num_commands, slug_env.infra_error, slug_env.last_grade) == (False, 0, None, None)
    slug_env.close()
    assert not second.exists() and slug_env.workspace is None


@needs_bwrap
def test_submit_sets_done_and_stops_commands(slug_env: SWERepairEnv) -> None:
    assert "Submitted" in slug_env.submit()
    assert slug_env.done
    assert "already submitted" in slug_env.run_shell("touch late.txt")
    assert not (slug_env.workspace / "late.txt").exists()


@needs_bwrap
def test_observation_reports_exit_code_output_and_timeout() -> None:
    with SWERepairEnv(limits=SandboxLimits(timeout_s=1.0)) as env:
        env.reset(task_id=SLUG)
        observation = env.run_shell("echo out; echo err >&2; exit 3")
        assert observation.startswith("exit_code: 3")
        assert "stdout:\nout" in observation and "stderr:\nerr" in observation
        assert "timed out" in env.run_shell("sleep 5")
        assert env.tool_time_s >= 1.0


def test_unknown_task_and_reward_before_reset() -> None:
    env = SWERepairEnv()
    with pytest.raises(TaskSetupError, match="before reset"):
        env.get_reward()
    with pytest.raises(UnknownTaskError, match="no_such_task"):
        env.reset(task_id="no_such_task")


# ---------------------------------------------------------------- SWE grading integrity


@needs_bwrap
def test_reference_solution_earns_reward_and_noop_does_not(slug_env: SWERepairEnv) -> None:
    assert slug_env.get_reward() == 0.0 and slug_env.infra_error is None
    slug_env.reset(task_id=SLUG)
    shell_ok(slug_env, overlay_command(load_swe_suite()[SLUG].solution_dir))
    assert slug_env.get_reward() == 1.0
    assert slug_env.last_grade.outcomes["tests/test_textkit.py::test_custom_separator"] == "PASSED"


_FAKE_TESTS = "".join(f"def {name}():\n    pass\n" for name in (
    "test_simple_words", "test_single_space", "test_repeated_separators_collapse",
    "test_no_leading_or_trailing_separator", "test_custom_separator"))
_CONFTEST_FIX = (
    "import re\nimport textkit\n"
    "textkit.slugify = lambda t, separator='-': separator.join(w for w in re.split('[^a-z0-9]+', t.lower()) if w)\n"
)
_FAKE_PYTEST = (
    "import sys\n"
    "print('\\n'.join('PASSED ' + a for a in sys.argv[1:] if '::' in a))\n"
)
REWARD_HACKS = {
    "rewrite the tests": f"cat > tests/test_textkit.py <<'EOF'\n{_FAKE_TESTS}EOF",
    "fix only inside conftest.py": f"cat > conftest.py <<'EOF'\n{_CONFTEST_FIX}EOF",
    "shadow pytest with pytest.py": f"cat > pytest.py <<'EOF'\n{_FAKE_PYTEST}EOF",
}


@needs_bwrap
@pytest.mark.parametrize("hack", sorted(REWARD_HACKS))
def test_editing_tests_or_harness_does_not_earn_reward(slug_env: SWERepairEnv, hack: str) -> None:
    shell_ok(slug_env, REWARD_HACKS[hack])
    tests = " ".join(load_swe_suite()[SLUG].fail_to_pass)
    shell_ok(slug_env, f"python3 -m pytest -q -p no:cacheprovider {tests}")  # the hack fools pytest in the workspace
    assert slug_env.get_reward() == 0.0
    assert slug_env.infra_error is None


@needs_bwrap
def test_symlinked_tests_dir_is_replaced_not_followed(slug_env: SWERepairEnv, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    shell_ok(slug_env, f"rm -rf tests && ln -s {victim} tests")
    assert slug_env.get_reward() == 0.0
    assert list(victim.iterdir()) == []  # the grader never wrote through the agent's link


@needs_bwrap
def test_breaking_collection_is_a_failed_attempt_not_infra(slug_env: SWERepairEnv) -> None:
    shell_ok(slug_env, "echo 'def broken(:' >> textkit.py")
    assert slug_env.get_reward() == 0.0
    assert slug_env.infra_error is None and "could not run" in slug_env.last_grade.detail


@needs_bwrap
def test_broken_grading_tests_are_infra_not_zero(tmp_path: Path) -> None:
    task = load_swe_suite()[SLUG]
    repo = tmp_path / "repo"
    shutil.copytree(task.repo_dir, repo)
    with (repo / "tests" / "test_textkit.py").open("a") as handle:
        handle.write("\ndef test_harness_typo(:\n")  # the grading tests themselves cannot be collected
    broken = dataclasses.replace(task, task_id="broken_harness", repo_dir=repo)
    with SWERepairEnv({broken.task_id: broken}, limits=LIMITS) as env:
        env.reset(task_id=broken.task_id)
        shell_ok(env, overlay_command(task.solution_dir))
        assert env.get_reward() is None
        assert "harness" in env.infra_error and env.last_grade.infra_error == env.infra_error


class _FailingSandbox:
    """A sandbox whose backend dies on the first command."""

    def __init__(self, workspace: Path, limits: SandboxLimits) -> None:
        self.workspace, self.workdir = workspace, "/workspace"

    def run(self, command: str, *, timeout_s=None, env=None, stdin=None) -> CommandResult:
        raise SandboxError("backend vanished")

    def close(self) -> None:
        pass


def test_sandbox_failure_during_episode_is_infra() -> None:
    with SWERepairEnv(sandbox_factory=_FailingSandbox) as env:
        env.reset(task_id=SLUG)
        assert "infrastructure" in env.run_shell("ls")
        assert env.get_reward() is None
        assert "backend vanished" in env.infra_error


# ---------------------------------------------------------------- terminal grading


def _terminal_task(tmp_path: Path, verifier: str, setup: tuple[str, ...] = ("echo hello > greeting.txt",)):
    path = tmp_path / "test_outputs.py"
    path.write_text(verifier)
    return TerminalTask(task_id="custom", instruction="say hello", verifier_file=path, solution_script="true",
                        setup=setup)


_TWO_CHECKS = """
from pathlib import Path
def test_greeting():
    assert Path('greeting.txt').read_text() == 'hello\\n'
def test_farewell():
    assert Path('farewell.txt').read_text() == 'bye\\n'
"""


@needs_bwrap
def test_terminal_reward_is_seta(tmp_path: Path) -> None:
    task = _terminal_task(tmp_path, _TWO_CHECKS)
    with TerminalTaskEnv([task], limits=LIMITS) as env:
        env.reset(task_id="custom")
        assert env.get_reward() == 0.5  # 1 of 2 checks: p = 0.5, no bonus
        env.reset(task_id="custom")
        shell_ok(env, "echo bye > farewell.txt")
        shell_ok(env, "mkdir -p .verifier && echo 'def test_x(): pass' > .verifier/test_outputs.py")
        assert env.get_reward() == 1.5  # the agent's .verifier/ plays no part: the verifier never enters the workspace
        env.reset(task_id="custom")
        shell_ok(env, "rm greeting.txt")
        assert env.get_reward() == 0.0 and env.infra_error is None


CRASHING_VERIFIERS = {
    "syntax error": "def test_greeting(:\n    pass\n",
    "fixture error": "import pytest\n@pytest.fixture\ndef broken():\n    raise RuntimeError('verifier bug')\n"
                     "def test_greeting(broken):\n    pass\n",
    "no checks": "HELPER = 1\n",
}


@needs_bwrap
@pytest.mark.parametrize("kind", sorted(CRASHING_VERIFIERS))
def test_crashing_verifier_is_infra_not_zero(tmp_path: Path, kind: str) -> None:
    with TerminalTaskEnv([_terminal_task(tmp_path, CRASHING_VERIFIERS[kind])], limits=LIMITS) as env:
        env.reset(task_id="custom")
        assert env.get_reward() is None
        assert env.infra_error


@needs_bwrap
def test_failed_setup_raises_and_cleans_up(tmp_path: Path) -> None:
    env = TerminalTaskEnv([_terminal_task(tmp_path, _TWO_CHECKS, setup=("exit 3",))], limits=LIMITS)
    with pytest.raises(TaskSetupError, match="exit 3"):
        env.reset(task_id="custom")
    assert env.workspace is None


# ---------------------------------------------------------------- SWE-bench style rows


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture
def swe_rows(tmp_path: Path) -> tuple[list[dict], Path]:
    """One SWE-bench style row built from the bundled slugify task: a git checkout, a gold patch, a test patch."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    task = load_swe_suite()[SLUG]
    repo_root = tmp_path / "checkouts"
    checkout = repo_root / "acme__textkit"
    shutil.copytree(task.repo_dir, checkout)
    tests_file = checkout / "tests" / "test_textkit.py"
    tests_text = tests_file.read_text()
    tests_file.unlink()
    _git(checkout, "init", "-q")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-q", "-m", "base")
    base = _git(checkout, "rev-parse", "HEAD").strip()
    shutil.copy(task.solution_dir / "textkit.py", checkout / "textkit.py")
    patch = _git(checkout, "diff")
    _git(checkout, "checkout", "--", "textkit.py")
    tests_file.write_text(tests_text)
    _git(checkout, "add", "-N", "tests/test_textkit.py")
    test_patch = _git(checkout, "diff")
    _git(checkout, "reset", "-q")
    tests_file.unlink()
    row = {
        "instance_id": "acme__textkit-1", "repo": "acme/textkit", "base_commit": base, "patch": patch,
        "test_patch": test_patch, "problem_statement": task.problem_statement,
        "FAIL_TO_PASS": json.dumps(list(task.fail_to_pass)), "PASS_TO_PASS": list(task.pass_to_pass),
        "image_name": "swesmith/acme__textkit:latest",
    }
    return [row], repo_root


def test_swe_rows_load_from_json_jsonl_and_memory(swe_rows, tmp_path: Path) -> None:
    rows, repo_root = swe_rows
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sources = (tmp_path / "rows.json", str(tmp_path / "rows.jsonl"), rows)
    loaded = [load_swe_rows(source, repo_root) for source in sources]
    assert loaded[0] == loaded[1] == loaded[2]
    task = loaded[0]["acme__textkit-1"]
    assert isinstance(task, SWETask)
    assert task.repo_dir == repo_root / "acme__textkit" and task.base_commit == rows[0]["base_commit"]
    assert task.fail_to_pass == load_swe_suite()[SLUG].fail_to_pass  # decoded from the JSON string
    assert task.test_files == ("tests/test_textkit.py",)


@needs_bwrap
def test_swe_row_round_trip_grades_with_hidden_test_patch(swe_rows) -> None:
    rows, repo_root = swe_rows
    tasks = load_swe_rows(rows, repo_root)
    with SWERepairEnv(tasks, limits=LIMITS) as env:
        env.reset(task_id="acme__textkit-1")
        assert (env.workspace / "textkit.py").is_file()
        assert not (env.workspace / "tests" / "test_textkit.py").exists()  # the test patch is applied only to grade
        assert not (env.workspace / ".git").exists()
        assert env.get_reward() == 0.0
        env.reset(task_id="acme__textkit-1")
        shell_ok(env, overlay_command(load_swe_suite()[SLUG].solution_dir))
        assert env.get_reward() == 1.0


def _without(row: dict, field: str) -> dict:
    return {k: v for k, v in row.items() if k != field}


@pytest.mark.parametrize("field", ["instance_id", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"])
def test_swe_row_missing_field_is_named(swe_rows, field: str) -> None:
    rows, repo_root = swe_rows
    with pytest.raises(TaskFormatError, match=rf"row 1 .*{field}"):
        load_swe_rows([rows[0], _without(rows[0], field)], repo_root)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"FAIL_TO_PASS": "[not json"}, "FAIL_TO_PASS.*JSON"),
        ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS is empty"),
        ({"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS.*list of test ids"),
        ({"repo": "acme/missing"}, "acme__missing"),
        ({"test_patch": "not a diff"}, "test_patch"),
        ({"problem_statement": ""}, "problem_statement"),
    ],
)
def test_swe_row_bad_values_are_rejected(swe_rows, change: dict, message: str) -> None:
    rows, repo_root = swe_rows
    with pytest.raises(TaskFormatError, match=message):
        load_swe_rows([{**rows[0], **change}], repo_root)


def test_swe_rows_file_errors(swe_rows, tmp_path: Path) -> None:
    rows, repo_root = swe_rows
    with pytest.raises(TaskFormatError, match="duplicate instance_id"):
        load_swe_rows(rows + rows, repo_root)
    (tmp_path / "object.json").write_text(json.dumps(rows[0]))
    with pytest.raises(TaskFormatError, match="expected a JSON list"):
        load_swe_rows(tmp_path / "object.json", repo_root)
    with pytest.raises(TaskFormatError, match="does not exist"):
        load_swe_rows(tmp_path / "missing.json", repo_root)


# ---------------------------------------------------------------- datasets, rewards, helpers


@pytest.mark.parametrize(("make", "suite"), [(swe_dataset, load_swe_suite), (terminal_dataset, load_terminal_suite)])
def test_datasets_are_trl_conversational(make, suite) -> None:
    dataset = make()
    assert len(dataset) == len(suite()) and set(dataset.column_names) == {"prompt", "task_id"}
    row = dataset[0]
    assert row["task_id"] in suite()
    [message] = row["prompt"]
    assert message["role"] == "user"
    for needle in ("run_shell", "submit", "/workspace"):
        assert needle in message["content"]


def test_swe_prompt_holds_the_problem_statement() -> None:
    row = next(r for r in swe_dataset() if r["task_id"] == SLUG)
    assert load_swe_suite()[SLUG].problem_statement in row["prompt"][0]["content"]


def test_reward_formulas() -> None:
    assert seta_reward(3, 4) == 0.75 and seta_reward(4, 4) == 1.5 and seta_reward(0, 4) == 0.0
    with pytest.raises(ValueError):
        seta_reward(0, 0)
    outcomes = {"f": "PASSED", "p1": "PASSED", "p2": "SKIPPED"}
    assert swe_reward(outcomes, ("f",), ("p1", "p2")) == 1.0
    assert swe_reward({**outcomes, "p1": "FAILED"}, ("f",), ("p1",)) == 0.0
    assert swe_reward({**outcomes, "f": "ERROR"}, ("f",), ()) == 0.0
    assert swe_reward({}, ("f",), ()) == 0.0


def test_local_fallback_sandbox_follows_the_protocol(tmp_path: Path) -> None:
    box = LocalSubprocessSandbox(tmp_path, SandboxLimits(timeout_s=1.0))
    assert isinstance(box, Sandbox)
    result = box.run("echo hi > f && cat f")
    assert result.ok and result.stdout == "hi\n"
    slow = box.run("sleep 5")
    assert slow.timed_out and slow.exit_code is None


def test_local_sandbox_feeds_stdin(tmp_path: Path) -> None:
    from trl_thundersync.envs.runtimes.local import LocalSubprocessSandbox

    box = LocalSubprocessSandbox(tmp_path)
    assert box.run("cat", stdin=b"fed").stdout == "fed"
    assert box.run("cat").stdout == ""
