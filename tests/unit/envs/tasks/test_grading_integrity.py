"""Grading integrity: outcomes only over the runner's nonce channel, a hidden verifier, bounded grading copies.

Each attack below is an agent's move through the product's own entry points (`reset`, `run_shell`, `get_reward`):
forging PASSED lines, reading or replacing the verifier, ending the test run to escape the penalty, planting a link
to a host directory, or filling the workspace. The runner-level tests use the unsandboxed local fallback (no
bubblewrap needed); the environment tests run under the real sandbox (skipped without `bwrap`, unless CI sets
THUNDERSYNC_REQUIRE_SANDBOX=1).
Run: python -m pytest tests/unit/envs/tasks/test_grading_integrity.py -q
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from trl_thundersync.envs.environments.swe import SWERepairEnv
from trl_thundersync.envs.environments.terminal import TerminalTaskEnv
from trl_thundersync.envs.runtimes.api import SandboxLimits
from trl_thundersync.envs.runtimes.local import LocalSubprocessSandbox
from trl_thundersync.envs.suites.swe import overlay_command
from trl_thundersync.envs.tasks import TaskFormatError, load_swe_suite, load_terminal_suite
from trl_thundersync.envs.tasks.grading import GradingLimits, UngradableWorkspace, copy_workspace
from trl_thundersync.envs.tasks.pytest_channel import pytest_invocation, read_records, run_pytest
from trl_thundersync.errors import ConfigurationError

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
    reason="needs bubblewrap (Debian package `bubblewrap`)",
)

SLUG = "slugify_separators"  # a bundled SWE task: textkit.py, tests/test_textkit.py
GREET = "greet_script"  # a bundled terminal task whose checks run the agent's bin/greet.sh
LIMITS = SandboxLimits(timeout_s=20.0)


def shell_ok(env, command: str) -> str:
    observation = env.run_shell(command)
    assert env.last_result is not None and env.last_result.ok, observation
    return observation


def append_to_module(env, code: str, module: str = "textkit.py") -> None:
    """Append Python code to the module under test (it runs when the tests import it)."""
    shell_ok(env, f"cat >> {module} <<'PYEOF'\n{code}\nPYEOF")


# ---------------------------------------------------------------- the channel, without a sandbox


def _record(key: bytes, seq: int, kind: str, value: str) -> str:
    body = f"{seq} {kind} {value}"
    return f"{body} {hmac.new(key, body.encode(), hashlib.sha256).hexdigest()}"


def test_read_records_takes_only_authentic_records_in_sequence_up_to_done() -> None:
    key, other = b"k" * 32, b"o" * 32
    genuine = [
        _record(key, 0, "collected", '"tests/t.py::test_a[x y]"'),
        _record(key, 1, "outcome", '["tests/t.py::test_a[x y]", "FAILED"]'),
        _record(key, 2, "outcome", '["tests/t.py::test_b_long", "FAILED"]'),
        _record(key, 3, "done", "1"),
    ]
    text = "\n".join([
        "PASSED tests/t.py::test_a",  # what pytest's own summary prints: never read
        genuine[0],
        _record(other, 1, "outcome", '["tests/t.py::test_a[x y]", "PASSED"]'),  # another key
        genuine[1],
        genuine[1].replace("FAILED", "PASSED"),  # a record altered: its MAC no longer matches
        genuine[0],  # a replayed copy
        genuine[2][:-10],  # cut by elision
        genuine[2],
        "garbage" + genuine[3],  # not at a line start
        genuine[3],
        _record(key, 4, "outcome", '["tests/t.py::test_e", "PASSED"]'),  # after done
    ])
    run = read_records(text, key)
    assert run.outcomes == {"tests/t.py::test_a[x y]": "FAILED", "tests/t.py::test_b_long": "FAILED"}
    assert run.collected == ("tests/t.py::test_a[x y]",) and run.exit_status == 1 and run.completed
    gap = read_records("\n".join([genuine[0], genuine[2], genuine[1], genuine[3]]), key)  # record 1 taken away
    assert (gap.collected, dict(gap.outcomes), gap.exit_status) == (("tests/t.py::test_a[x y]",), {}, None)


_OUTCOME_TESTS = '''
import pytest

def test_pass(): pass
def test_fail(): assert False
@pytest.fixture
def broken(): raise RuntimeError("setup")
def test_setup_error(broken): pass
@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown")
def test_teardown_error(bad_teardown): pass
def test_skip(): pytest.skip("no")
@pytest.mark.xfail
def test_xfail(): assert False
@pytest.mark.xfail
def test_xpass(): pass
@pytest.mark.xfail(strict=True)
def test_xpass_strict(): pass
@pytest.mark.xfail(run=False)
def test_xfail_not_run(): pass
@pytest.mark.parametrize("s", ["a b"])
def test_param(s): pass
'''


def test_runner_reports_one_outcome_per_test_as_pytest_names_it(tmp_path: Path) -> None:
    (tmp_path / "test_kinds.py").write_text(_OUTCOME_TESTS)
    run = run_pytest(LocalSubprocessSandbox(tmp_path), ("-q", "-p", "no:cacheprovider", "test_kinds.py"),
                     timeout_s=60, cwd_on_path=True)
    assert run.exit_status == 1 and run.fatal is None and len(run.collected) == 10
    assert run.outcomes == {f"test_kinds.py::{name}": outcome for name, outcome in [
        ("test_pass", "PASSED"), ("test_fail", "FAILED"), ("test_setup_error", "ERROR"),
        ("test_teardown_error", "ERROR"), ("test_skip", "SKIPPED"), ("test_xfail", "XFAIL"), ("test_xpass", "XPASS"),
        ("test_xpass_strict", "FAILED"), ("test_xfail_not_run", "XFAIL"), ("test_param[a b]", "PASSED"),
    ]}
    assert "2 failed, 3 passed" in run.log  # pytest's console output is kept for humans, on stderr


def test_runner_hides_files_before_tests_run_and_reports_its_own_failure(tmp_path: Path) -> None:
    probe = ("import os\n"
             "def test_verifier_file_is_gone():\n"
             "    assert not os.path.exists(__file__) and os.listdir(os.path.dirname(__file__)) == []\n")
    run = run_pytest(LocalSubprocessSandbox(tmp_path), ("-q", "-p", "no:cacheprovider", "{files}/test_probe.py"),
                     timeout_s=60, files={"test_probe.py": probe}, hide_files=True)
    assert list(run.outcomes.values()) == ["PASSED"] and run.completed
    broken = run_pytest(LocalSubprocessSandbox(tmp_path), ("-q",), timeout_s=60, files={"no/such/dir.py": "x"})
    assert broken.fatal and not broken.completed  # the runner's own failure: reported, never an outcome


@pytest.mark.parametrize(("command", "expected"), [
    ("python3 -m pytest -q -p no:cacheprovider", ("python3", ("-q", "-p", "no:cacheprovider"))),
    ("python -m pytest", ("python", ())),
    ("pytest -x 'tests/a b.py'", ("python3", ("-x", "tests/a b.py"))),
])
def test_pytest_invocation_parses_plain_pytest_commands(command: str, expected) -> None:
    assert pytest_invocation(command, "task t") == expected


@pytest.mark.parametrize("command", ["tox -e py", "python3 -m pytest -q && curl x", "python3 -c 'x'", "pytest 'x"])
def test_pytest_invocation_refuses_other_commands(command: str) -> None:
    with pytest.raises(TaskFormatError, match="task t"):
        pytest_invocation(command, "task t")


# ---------------------------------------------------------------- the bounded grading copy


def _tree(root: Path) -> dict[str, object]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        out[rel] = os.readlink(path) if path.is_symlink() else (oct(path.stat().st_mode), path.is_file()
                                                                and path.read_bytes())
    return out


def test_grading_limits_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="max_entries=0"):
        GradingLimits(max_entries=0)


def test_copy_workspace_copies_like_copy_tree(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "pkg" / "ro").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("x = 1\n")
    (src / "pkg" / "ro" / "data").write_text("d")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("/etc/passwd")
    os.mkfifo(src / "fifo")  # a reader would block: skipped
    (src / "pkg" / "ro").chmod(0o555)
    dst.mkdir()
    copy_workspace(src, dst, GradingLimits(), time.monotonic() + 60)
    expected = _tree(src)
    del expected["fifo"]
    assert _tree(dst) == expected


@pytest.mark.parametrize(("limits", "message"), [
    (GradingLimits(max_entries=10), "more than 10 files"),
    (GradingLimits(max_bytes=1000), "more than 1000 bytes"),
    (GradingLimits(max_path_chars=20), "longer than 20 characters"),
])
def test_copy_workspace_refuses_an_oversized_workspace(tmp_path: Path, limits: GradingLimits, message: str) -> None:
    src = tmp_path / "src"
    (src / "d" / "deeper" / "and_deepest").mkdir(parents=True)  # 20 characters, then more below
    for i in range(20):
        (src / f"f{i}").write_bytes(b"x" * 100)
    (src / "d" / "deeper" / "and_deepest" / "f").touch()
    (tmp_path / "dst").mkdir()
    with pytest.raises(UngradableWorkspace, match=message):
        copy_workspace(src, tmp_path / "dst", limits, time.monotonic() + 60)
    (tmp_path / "late").mkdir()
    with pytest.raises(UngradableWorkspace, match="time budget"):
        copy_workspace(src, tmp_path / "late", GradingLimits(), time.monotonic() - 1)


_AS_NOBODY = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root (to act as another user, as a non-root grader would) and setpriv")


@_AS_NOBODY
def test_remove_path_opens_up_directories_the_agent_locked() -> None:
    import subprocess
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="ts-locked-"))  # under /tmp: traversable by another user
    try:
        tree = base / "workspace"
        (tree / "locked" / "deeper").mkdir(parents=True)
        (tree / "locked" / "deeper" / "f").touch()
        (tree / "read_only").mkdir()
        (tree / "read_only" / "g").touch()
        (tree / "locked").chmod(0)  # what `chmod 000 locked` by the agent (same uid) leaves
        (tree / "read_only").chmod(0o500)
        # the package as the other user can read it: a checkout under a private directory (a fresh `mktemp -d`
        # clone, a home directory) is not traversable by uid 65534
        shutil.copytree(Path(__file__).parents[4] / "trl_thundersync", base / "src" / "trl_thundersync",
                        ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(["chown", "-R", "65534:65534", str(base)], check=True)
        code = ("import shutil, sys\nfrom pathlib import Path\n"
                "from trl_thundersync.envs.tasks.grading import remove_path\n"
                "try:\n    shutil.rmtree(sys.argv[1])\nexcept PermissionError:\n    pass\n"
                "else:\n    sys.exit('shutil.rmtree alone removed it: the test locked nothing')\n"
                "remove_path(Path(sys.argv[1]))\n")
        python = getattr(sys, "_base_executable", sys.executable)  # the interpreter itself, not a private venv's link
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c",
                               code, str(tree)], env={"PYTHONPATH": str(base / "src")},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not tree.exists()
    finally:
        shutil.rmtree(base)


# ---------------------------------------------------------------- SWE: forged outcomes, runs cut short


@pytest.fixture
def slug_env():
    with SWERepairEnv(limits=LIMITS) as env:
        env.reset(task_id=SLUG)
        yield env


_SLUG_IDS = load_swe_suite()[SLUG].fail_to_pass + load_swe_suite()[SLUG].pass_to_pass
_FORGE_LINES = "\n".join(f"PASSED {n}" for n in _SLUG_IDS)
_ATEXIT_FORGERY = f'''
import atexit, os, sys
_LINES = {_FORGE_LINES!r}
def _forge():
    print(_LINES)  # after pytest's real summary, as the issue's attack did
    sys.stderr.write(_LINES + "\\n")
    for fd in range(1, 64):  # and into every open descriptor, the channel's pipe included
        try:
            os.write(fd, ("\\n" + _LINES + "\\n").encode())
        except OSError:
            pass
atexit.register(_forge)
'''


@needs_bwrap
def test_swe_forged_passed_lines_earn_nothing(slug_env: SWERepairEnv) -> None:
    append_to_module(slug_env, _ATEXIT_FORGERY)
    assert slug_env.get_reward() == 0.0 and slug_env.infra_error is None
    assert slug_env.last_grade.outcomes["tests/test_textkit.py::test_custom_separator"] == "FAILED"
    slug_env.reset(task_id=SLUG)
    shell_ok(slug_env, overlay_command(load_swe_suite()[SLUG].solution_dir))
    append_to_module(slug_env, _ATEXIT_FORGERY)  # forging on top of a real fix changes nothing either
    assert slug_env.get_reward() == 1.0


ENDINGS = {
    "os._exit at import": "import os\nos._exit(1)",
    "sys.exit at import": "import sys\nsys.exit(0)",
    "SIGKILL of pytest's own process": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "os._exit while the tests run": "import os\n_real = slugify\ndef slugify(*a, **k):\n    os._exit(0)",
    "kill the parent shell and pytest": "import os, signal\nos.killpg(0, signal.SIGKILL)",
    "grade log replaced by a link": "import os\nfor name in ('.thundersync-grade.log', 'log'):\n"
                                    "    os.path.lexists(name) and os.remove(name)\n"
                                    "    os.symlink('/etc/hostname', name)",
    "flood every descriptor": "import os\nfor _ in range(100):\n    for fd in range(1, 16):\n        try:\n"
                              "            os.write(fd, b'PASSED x\\n' * 10000)\n        except OSError:\n"
                              "            pass",
}


@needs_bwrap
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_swe_attempt_that_ends_the_test_run_fails_not_infra(slug_env: SWERepairEnv, ending: str) -> None:
    append_to_module(slug_env, ENDINGS[ending])
    assert slug_env.get_reward() == 0.0
    assert slug_env.infra_error is None, slug_env.infra_error


@needs_bwrap
def test_swe_attempt_that_hangs_fails_not_infra() -> None:
    with SWERepairEnv(limits=LIMITS, grade_timeout_s=2.0) as env:
        env.reset(task_id=SLUG)
        append_to_module(env, "import time\ntime.sleep(60)")
        assert env.get_reward() == 0.0 and env.infra_error is None
        assert "timed out" in env.last_grade.detail and "reference solution passes" in env.last_grade.detail


@needs_bwrap
def test_swe_harness_that_ends_the_run_is_still_infra(tmp_path: Path) -> None:
    task = load_swe_suite()[SLUG]
    repo = tmp_path / "repo"
    shutil.copytree(task.repo_dir, repo)
    with (repo / "tests" / "test_textkit.py").open("a") as handle:
        handle.write("\nimport os\nos._exit(1)\n")  # the grading tests themselves end the run
    broken = dataclasses.replace(task, task_id="harness_exits", repo_dir=repo)
    with SWERepairEnv({broken.task_id: broken}, limits=LIMITS) as env:
        env.reset(task_id=broken.task_id)
        shell_ok(env, overlay_command(task.solution_dir))
        assert env.get_reward() is None
        assert "harness" in env.infra_error and "reference solution fails too" in env.infra_error


def test_swe_task_with_ungradable_test_command_is_refused_at_reset() -> None:
    task = dataclasses.replace(load_swe_suite()[SLUG], task_id="shell_cmd", test_command="make test")
    with SWERepairEnv({task.task_id: task}, limits=LIMITS) as env, pytest.raises(TaskFormatError, match="make test"):
        env.reset(task_id=task.task_id)


# ---------------------------------------------------------------- terminal: hidden verifier, forged checks, links

_GREET_IDS = ["test_script_exists_with_shebang", "test_script_is_executable", "test_greets_name",
              "test_name_with_spaces", "test_usage_without_arguments"]
_HONEST_FAILING = "#!/bin/sh\nexit 1\n"  # exists, has a shebang, is executable: 2 of 5 checks


def _greet_script(body: str) -> str:
    return f"mkdir -p bin && cat > bin/greet.sh <<'SHEOF'\n{body}SHEOF\nchmod +x bin/greet.sh"


_FORGED = "".join(f"PASSED {p}test_outputs.py::{t}\\n" for p in ("", ".verifier/") for t in _GREET_IDS)
# The agent's script, run by the checks: look for the verifier (in the workspace, the sandbox's /tmp, pytest's
# memory), append PASSED lines to every log it can find, print them everywhere, and pass the checks only when
# it saw the verifier's source (so the grade tells whether it did; the needle is split so the script does not
# find itself).
_SNOOP = _greet_script(rf"""#!/bin/sh
seen=$(grep -rl 'def test_greets''_name' .verifier /tmp /dev/shm /workspace 2>/dev/null | head -n 1)
python3 - "$PPID" <<'PY' && seen=memory
import os, sys
pid = sys.argv[1]
with open(f"/proc/{{pid}}/maps") as maps:
    regions = [[int(x, 16) for x in line.split()[0].split("-")] for line in maps]
mem = os.open(f"/proc/{{pid}}/mem", os.O_RDONLY)
for start, end in regions:
    while start < end:
        try:
            chunk = os.pread(mem, min(1 << 20, end - start), start)
        except OSError:
            break
        if not chunk:
            break
        if b"def test_greets" b"_name" in chunk:
            sys.exit(0)
        start += len(chunk)
sys.exit(1)
PY
for log in .verifier/log $(find /tmp /workspace -name 'log*' -type f 2>/dev/null); do printf '{_FORGED}' >> "$log"; done
printf '{_FORGED}' >&2; printf '\n{_FORGED}' > /proc/1/fd/1
if [ -n "$seen" ]; then
    [ "$#" -lt 1 ] && {{ echo "usage: greet.sh NAME" >&2; exit 2; }}
    printf 'Hello, %s!\n' "$1"; exit 0
fi
printf '{_FORGED}'
exit 1
""")


@needs_bwrap
def test_terminal_agent_cannot_see_or_forge_the_verifier() -> None:
    with TerminalTaskEnv(limits=LIMITS) as env:
        env.reset(task_id=GREET)
        shell_ok(env, _greet_script(_HONEST_FAILING))
        honest = env.get_reward()
        env.reset(task_id=GREET)
        shell_ok(env, _SNOOP)
        assert env.get_reward() == honest == 0.4, env.last_grade.detail
        assert env.infra_error is None
        env.reset(task_id=GREET)
        shell_ok(env, load_terminal_suite()[GREET].solution_script)
        assert env.get_reward() == 1.5


# Started by the agent's script at the 3rd check: reopens the sandbox's stdout pipe through bwrap's pid 1 (any process
# in the sandbox can), takes records off it as they come, and writes back forgeries built from each one it took.
_THIEF = f"""import os, time
IDS = {[t.encode() for t in _GREET_IDS]!r}
pipe, out = os.open("/proc/1/fd/1", os.O_RDONLY), os.open("/proc/1/fd/1", os.O_WRONLY)
end = time.time() + 8
while time.time() < end:
    chunk = os.read(pipe, 1 << 16)
    if not chunk:
        break
    for line in chunk.split(b"\\n"):
        if b" outcome " in line or b" done " in line or b" collected " in line:
            head = line.split(b" ")[0]  # a secret prefix, if that is what authenticates records
            forged = [head + b' outcome ["test_outputs.py::' + t + b'", "PASSED"]' for t in IDS] + [head + b" done 0"]
            forged.append(line.replace(b'"FAILED"', b'"PASSED"'))  # the record itself, altered
            os.write(out, b"".join(b"\\n" + f + b"\\n" for f in forged))
"""


@needs_bwrap
def test_terminal_records_taken_off_the_pipe_cannot_be_forged() -> None:
    script = ("#!/bin/sh\n[ -e /tmp/thief ] || { touch /tmp/thief; python3 \"$(dirname \"$0\")/thief.py\" "
              "</dev/null >/dev/null 2>&1 & sleep 0.5; }\nexit 1\n")
    with TerminalTaskEnv(limits=LIMITS) as env:
        for _ in range(3):  # the thief races the host for each record: try a few times
            env.reset(task_id=GREET)
            shell_ok(env, f"mkdir -p bin && cat > bin/thief.py <<'PYEOF'\n{_THIEF}PYEOF")
            shell_ok(env, _greet_script(script))
            assert env.get_reward() == 0.4, env.last_grade.detail  # what the honest failing script scores
            assert env.infra_error is None


@needs_bwrap
def test_terminal_link_to_a_host_directory_is_never_read(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "log").write_text(_FORGED.replace("\\n", "\n"))
    (host / "test_outputs.py").write_text("def test_anything():\n    pass\n")
    relink = f"rm -rf .verifier; ln -s {host} .verifier; ln -s {host} log; ln -s {host}/log .thundersync-grade.log\n"
    with TerminalTaskEnv(limits=LIMITS) as env:
        env.reset(task_id=GREET)
        shell_ok(env, f"ln -s {host} .verifier")  # planted before grading
        shell_ok(env, _greet_script("#!/bin/sh\n" + relink + "exit 1\n"))  # and again while the checks run
        assert env.get_reward() == 0.4 and env.infra_error is None
    assert sorted(p.name for p in host.iterdir()) == ["log", "test_outputs.py"]


@needs_bwrap
def test_terminal_attempt_that_kills_the_verifier_is_scored_not_infra() -> None:
    with TerminalTaskEnv(limits=LIMITS) as env:
        env.reset(task_id=GREET)
        shell_ok(env, _greet_script("#!/bin/sh\nkill -9 $PPID\nexit 1\n"))  # pytest dies at the 3rd check
        assert env.get_reward() == 0.4, env.last_grade.detail  # the 2 checks that passed, of the reference's 5
        assert env.infra_error is None and "reference solution passes" in env.last_grade.detail


# ---------------------------------------------------------------- grading limits and budget


@needs_bwrap
@pytest.mark.parametrize("env_class", [SWERepairEnv, TerminalTaskEnv])
def test_oversized_workspace_is_a_failed_attempt(env_class) -> None:
    task_id = SLUG if env_class is SWERepairEnv else GREET
    with env_class(limits=LIMITS, grading_limits=GradingLimits(max_entries=200)) as env:
        env.reset(task_id=task_id)
        shell_ok(env, "mkdir junk && cd junk && seq 1 300 | xargs touch")
        assert env.get_reward() == 0.0 and env.infra_error is None
        assert "more than 200 files" in env.last_grade.detail


class _RecordingSandbox:
    """The real sandbox, recording the time limit of every command."""

    timeouts: list[float] = []

    def __init__(self, workspace: Path, limits: SandboxLimits) -> None:
        from trl_thundersync.envs.runtimes import make_sandbox

        self._inner = make_sandbox(workspace, limits)
        self.workspace, self.workdir = self._inner.workspace, self._inner.workdir

    def run(self, command: str, *, timeout_s=None, env=None, stdin=None):
        self.timeouts.append(timeout_s)
        return self._inner.run(command, timeout_s=timeout_s, env=env, stdin=stdin)

    def close(self) -> None:
        self._inner.close()


@needs_bwrap
def test_grading_copy_counts_inside_the_grade_timeout() -> None:
    with SWERepairEnv(limits=LIMITS, sandbox_factory=_RecordingSandbox, grade_timeout_s=30.0) as env:
        env.reset(task_id=SLUG)
        assert env.get_reward() == 0.0
        assert 0 < _RecordingSandbox.timeouts[-1] < 30.0  # what copying took was taken off the test run's budget
        env.reset(task_id=SLUG)
        env.grade_timeout_s = 1e-9  # no time at all: the copy cannot finish
        assert env.get_reward() == 0.0 and env.infra_error is None
        assert "time budget" in env.last_grade.detail
