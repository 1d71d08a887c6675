"""BwrapSandbox hardening (issue 9): host kernel settings, hidden task answers, long commands, aggregate limits.

Real commands under bubblewrap; skipped where `bwrap` is not installed. The /proc, memory-cgroup and quota tests
matter as root (CI runs as root): that is where the sandbox uid is host uid 0 and where the cgroup and tmpfs caps
apply. No test changes a host setting: /proc/sys files are written with the value they already hold.
Run: python -m pytest tests/unit/envs/runtimes/test_sandbox_hardening.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import site
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import trl_thundersync.envs.runtimes.bwrap as sandbox_module
from trl_thundersync.envs.environments.shell_env import ShellTaskEnv
from trl_thundersync.envs.runtimes.api import SandboxError, SandboxLimits
from trl_thundersync.envs.runtimes.bwrap import BwrapSandbox
from trl_thundersync.envs.runtimes.mounts import hidden_mount_args, outermost_paths
from trl_thundersync.envs.runtimes.workspace import create_workspace, quota_enforced, release_workspace
from trl_thundersync.envs.tasks.grading import GradeReport
from trl_thundersync.envs.tasks.pytest_channel import run_pytest
from trl_thundersync.envs.tasks.suites import tasks_root
from trl_thundersync.errors import ConfigurationError

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
                                reason="needs bubblewrap (Debian package `bubblewrap`)")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="root only: the cgroup and tmpfs caps are set up as root")

LIMITS = SandboxLimits(timeout_s=20.0, output_bytes=1 << 16)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def sandbox(workspace: Path):
    with BwrapSandbox(workspace, LIMITS) as box:
        yield box


def run_python(box: BwrapSandbox, workspace: Path, source: str) -> object:
    """Run `source` with python3 inside; it prints one JSON value, returned decoded."""
    (workspace / "probe.py").write_text(source)
    result = box.run("python3 probe.py")
    assert result.ok, result
    return json.loads(result.stdout)


def mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


# ---------------------------------------------------------------- /proc: no host kernel setting is writable

_SAME_VALUE_WRITES = """\
import errno, json, os
outcome = {}
for rel in ("kernel/printk_ratelimit", "kernel/randomize_va_space", "kernel/core_pattern"):
    path = "/proc/sys/" + rel
    value = open(path, "rb").read()  # written back unchanged: a harmless write if it went through
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value)
        finally:
            os.close(fd)
        outcome[rel] = "written"
    except OSError as error:
        outcome[rel] = errno.errorcode[error.errno]
outcome["vm/drop_caches writable"] = os.access("/proc/sys/vm/drop_caches", os.W_OK)
print(json.dumps(outcome))
"""


def test_proc_sys_writes_fail_even_with_the_same_value(sandbox: BwrapSandbox, workspace: Path) -> None:
    host = {rel: Path("/proc/sys", rel).read_bytes() for rel in ("kernel/printk_ratelimit", "kernel/core_pattern")}
    outcome = run_python(sandbox, workspace, _SAME_VALUE_WRITES)
    assert outcome == {"kernel/printk_ratelimit": "EROFS", "kernel/randomize_va_space": "EROFS",
                       "kernel/core_pattern": "EROFS", "vm/drop_caches writable": False}, outcome
    assert {rel: Path("/proc/sys", rel).read_bytes() for rel in host} == host
    assert sandbox.run("cat /proc/sys/kernel/ostype").stdout == "Linux\n"  # still readable


_PROC_SWEEP = """\
import json, os, stat
writable, readable_masked = [], []
for directory, subdirs, files in os.walk("/proc"):
    if directory == "/proc":  # the sandbox's own processes: /proc/<pid>, self, thread-self
        subdirs[:] = [d for d in subdirs if not d.isdigit() and d not in ("self", "thread-self")]
    for name in files + subdirs:
        path = os.path.join(directory, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISLNK(mode) or not os.access(path, os.W_OK):
            continue
        if stat.S_ISCHR(mode):  # a masked entry (/dev/null on the nodev /proc): opening it must fail
            try:
                os.close(os.open(path, os.O_WRONLY))
            except OSError:
                continue
        writable.append(path)
print(json.dumps(writable))
"""


def test_nothing_host_global_under_proc_is_writable(sandbox: BwrapSandbox, workspace: Path) -> None:
    assert run_python(sandbox, workspace, _PROC_SWEEP) == []


def test_root_only_proc_entries_are_masked_and_net_sysctls_are_the_sandboxes(sandbox: BwrapSandbox) -> None:
    private = [f"/proc/{n}" for n in os.listdir("/proc")
               if not n.isdigit() and not os.path.islink(f"/proc/{n}") and not os.stat(f"/proc/{n}").st_mode & 0o004]
    for path in private:  # /proc/kmsg, /proc/timer_list, /proc/slabinfo, ... as present on this kernel
        result = sandbox.run(f"head -c 64 {path}")
        assert result.exit_code != 0 and result.stdout == "", (path, result)
    interfaces = sandbox.run("ls /proc/sys/net/ipv4/conf").stdout.split()
    assert interfaces == ["all", "default", "lo"]  # the sandbox's network namespace, not the host's


# ---------------------------------------------------------------- task answers are not readable inside


def fake_install(prefix: Path, site: str = "lib/python3.11/site-packages") -> Path:
    """A wheel-like install of this package's task data under `prefix` (`site`: its site-packages, default a venv's);
    its package dir."""
    package = prefix / site / "trl_thundersync"
    terminal = package / "envs" / "tasks" / "terminal" / "count_lines"
    terminal.mkdir(parents=True)
    (terminal / "solution.sh").write_text("echo the answer\n")
    (terminal / "test_outputs.py").write_text("def test_hidden(): pass\n")
    swe = package / "envs" / "tasks" / "swe" / "bug" / "solution"
    swe.mkdir(parents=True)
    (swe / "fix.py").write_text("FIXED = True\n")
    (package / "__init__.py").write_text("# ordinary package code stays readable\n")
    (package / "envs" / "tasks" / "grading.py").write_text("# so does this\n")
    return package


def test_task_data_under_a_bound_prefix_is_hidden(workspace: Path, tmp_path: Path) -> None:
    package = fake_install(tmp_path / "venv")
    with BwrapSandbox(workspace, LIMITS, extra_ro_binds=[tmp_path / "venv"]) as box:
        tasks = package / "envs" / "tasks"
        for secret in (tasks / "terminal/count_lines/solution.sh", tasks / "terminal/count_lines/test_outputs.py",
                       tasks / "swe/bug/solution/fix.py"):
            result = box.run(f"cat {secret}")
            assert result.exit_code != 0 and result.stdout == "", secret
        assert box.run(f"ls -A {tasks / 'terminal'} {tasks / 'swe'}").stdout.split() == [
            f"{tasks / 'swe'}:", f"{tasks / 'terminal'}:"]  # empty covers
        assert box.run(f"cat {package / '__init__.py'}").stdout.startswith("# ordinary")
        assert box.run(f"cat {tasks / 'grading.py'}").ok
        assert box.run(f"echo x > {tasks / 'terminal' / 'new'}").exit_code != 0  # the cover is read-only


def test_the_installed_task_data_is_unreadable_inside(sandbox: BwrapSandbox) -> None:
    solutions = sorted(tasks_root().glob("terminal/*/solution.sh")) + sorted(tasks_root().glob("swe/*/solution"))
    verifiers = sorted(tasks_root().glob("terminal/*/test_outputs.py"))
    assert solutions and verifiers
    for path in (solutions[0], verifiers[0]):
        result = sandbox.run(f"cat {path}")  # absent (its directory is not bound) or under an empty cover
        assert result.exit_code != 0 and result.stdout == "", result
    for directory in (tasks_root() / "swe", tasks_root() / "terminal"):
        assert sandbox.run(f"ls -A {directory}").stdout == ""

def test_hidden_paths_argument_covers_files_and_directories(workspace: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "answers").mkdir(parents=True)
    (data / "answers" / "a.txt").write_text("secret")
    (data / "key.txt").write_text("secret")
    (data / "public.txt").write_text("public")
    hidden = [data / "answers", data / "key.txt", tmp_path / "not-there"]
    with BwrapSandbox(workspace, LIMITS, extra_ro_binds=[data], hidden_paths=hidden) as box:
        assert box.run(f"cat {data / 'answers' / 'a.txt'}").exit_code != 0
        assert box.run(f"cat {data / 'key.txt'}").stdout == ""
        assert box.run(f"cat {data / 'public.txt'}").stdout == "public"


def test_only_the_outermost_covers_are_kept() -> None:
    paths = ["/p/tasks/swe/bug/solution", "/p/tasks/swe", "/p/tasks/swe-extra", "/p/tasks/swe",
             "/p/tasks/terminal/t/test_outputs.py", "/p/tasks/terminal", "/q"]
    assert outermost_paths(paths) == ("/p/tasks/swe", "/p/tasks/swe-extra", "/p/tasks/terminal", "/q")
    assert outermost_paths(["/p/tasks/swe/bug", "/"]) == ("/",)
    assert outermost_paths([]) == ()


def test_answer_paths_inside_the_covered_task_data_get_no_cover_of_their_own(tmp_path: Path) -> None:
    """The wheel layout: each task's answers lie inside the covered task data folders, whichever order they come in."""
    tasks = fake_install(tmp_path / "venv") / "envs" / "tasks"
    bound = (str(tmp_path / "venv"),)
    folders = [str(tasks / "swe"), str(tasks / "terminal")]
    answers = [str(tasks / "swe/bug/solution"), str(tasks / "terminal/count_lines/test_outputs.py")]
    outer = tuple(arg for folder in folders for arg in ("--tmpfs", folder, "--remount-ro", folder))
    assert hidden_mount_args([*folders, *answers], bound) == outer
    assert hidden_mount_args([*answers, *folders], bound) == outer
    assert hidden_mount_args(answers, bound) == (  # alone, each answer path is covered itself
        "--tmpfs", answers[0], "--remount-ro", answers[0], "--ro-bind", "/dev/null", answers[1])


@pytest.mark.parametrize("site", ["lib/python3.11/site-packages", "local/lib/python3.11/dist-packages",
                                  "lib/python3/dist-packages"], ids=["venv", "usr-local", "debian-system"])
def test_an_installed_copys_task_answers_are_hidden_and_commands_still_run(workspace: Path, tmp_path: Path,
                                                                            site: str) -> None:
    """The wheel-install regression: with a task's own answer paths passed as `hidden_paths` (as the environments
    do) under the installed task data, bubblewrap failed to make their mount points in the read-only outer cover and
    no command ran. Venv, /usr/local and Debian system site-packages layouts, bound like an interpreter prefix."""
    root = tmp_path / "prefix"
    tasks = fake_install(root, site) / "envs" / "tasks"
    answers = [tasks / "swe/bug/solution", tasks / "terminal/count_lines/test_outputs.py"]
    with BwrapSandbox(workspace, LIMITS, extra_ro_binds=[root], hidden_paths=answers) as box:
        assert box.run("echo ran").stdout == "ran\n"
        for secret in (answers[0] / "fix.py", answers[1], tasks / "terminal/count_lines/solution.sh"):
            result = box.run(f"cat {secret}")
            assert result.exit_code != 0 and result.stdout == "", secret
        assert box.run(f"ls -A {tasks / 'swe'} {tasks / 'terminal'}").stdout.split() == [
            f"{tasks / 'swe'}:", f"{tasks / 'terminal'}:"]  # the outer covers, empty


def user_site_install(base: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This interpreter with a user site (`pip install --user`, PYTHONUSERBASE=`base`) on sys.path, holding a
    wheel-like install of this package and a module found nowhere else; its site-packages directory."""
    packages = base / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    fake_install(packages, ".")
    (packages / "only_in_user_site.py").write_text("VALUE = 42\n")
    (base / "share").mkdir()
    (base / "share" / "credentials").write_text("secret\n")  # other files of the user base
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(site, "USER_BASE", str(base))
    monkeypatch.setattr(site, "USER_SITE", str(packages))
    monkeypatch.setattr(sys, "path", [*sys.path, str(packages)])  # appended: the fake package must not shadow ours
    return packages


def test_a_user_site_is_bound_with_its_task_data_hidden_and_the_grader_imports_from_it(
        workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install --user`: the user site is bound read-only (not the rest of its base), commands get PYTHONUSERBASE,
    the package's task data there is covered, and the grading runner (`python3 -I`, which skips a user site) imports
    from it, ahead of the prefix's site-packages as the site module orders them."""
    base = tmp_path / "user-base"
    packages = user_site_install(base, monkeypatch)
    tasks = packages / "trl_thundersync" / "envs" / "tasks"
    with BwrapSandbox(workspace, LIMITS) as box:
        assert box.run(f"cat {packages / 'only_in_user_site.py'}").stdout == "VALUE = 42\n"
        assert box.run("echo $PYTHONUSERBASE").stdout == f"{base}\n"
        assert box.run(f"ls -A {base}").stdout == "lib\n"  # only the mount point's parents, not share/
        assert box.run(f"touch {packages / 'new.py'}").exit_code != 0  # read-only
        for secret in (tasks / "terminal/count_lines/solution.sh", tasks / "swe/bug/solution/fix.py"):
            result = box.run(f"cat {secret}")
            assert result.exit_code != 0 and result.stdout == "", secret
        assert box.run(f"cat {packages / 'trl_thundersync' / '__init__.py'}").ok  # the package's code stays readable
        probe = ("import site, sys, only_in_user_site\n"
                 "def test_the_user_site_comes_before_site_packages():\n"
                 "    assert only_in_user_site.VALUE == 42\n"
                 f"    user = sys.path.index({str(packages)!r})\n"
                 "    assert all(user < sys.path.index(p) for p in site.getsitepackages() if p in sys.path)\n")
        run = run_pytest(box, ("-q", "-p", "no:cacheprovider", "{files}/test_probe.py"), timeout_s=60,
                         files={"test_probe.py": probe})
        assert run.completed and list(run.outcomes.values()) == ["PASSED"], (run.fatal, run.log[-2000:])


# ---------------------------------------------------------------- long commands are the agent's, not an infra error


def test_a_one_mebibyte_command_runs_with_stdin_free(sandbox: BwrapSandbox) -> None:
    payload = "x" * (1 << 20)
    command = f"v='{payload}'; echo ${{#v}}; [ -e /proc/self/fd/3 ] && echo fd3-open; cat"
    result = sandbox.run(command, stdin=b"fed")
    assert result.ok and result.stdout == f"{len(payload)}\nfed", result
    assert result.command == command


def test_long_and_odd_commands_keep_the_shell_semantics(sandbox: BwrapSandbox) -> None:
    padding = "#" + "p" * (200 << 10) + "\n"  # over MAX_ARG_STRLEN: the memfd path
    failed = sandbox.run(padding + "echo before; exit 5")
    assert (failed.exit_code, failed.stdout) == (5, "before\n")
    assert sandbox.run(padding + "definitely-not-a-command").exit_code == 127
    assert sandbox.run("echo a\0b").ok  # a NUL byte is the command's own (it used to raise ValueError)
    assert sandbox.run("echo \ud800").ok  # so is a lone surrogate (JSON "\\ud800" in tool arguments)


def test_a_command_over_max_command_bytes_is_refused_as_a_result(workspace: Path) -> None:
    with BwrapSandbox(workspace, SandboxLimits(max_command_bytes=1000)) as box:
        assert box.run("echo " + "x" * 995).ok  # exactly 1000 bytes
        refused = box.run("touch made; echo " + "x" * 2000)
    assert refused.exit_code == 126 and not refused.ok and not refused.timed_out
    assert "max_command_bytes" in refused.stderr and "not run" in refused.stderr
    assert not (workspace / "made").exists()
    with pytest.raises(ConfigurationError, match="max_command_bytes"):
        BwrapSandbox(workspace, SandboxLimits(max_command_bytes=0))


# ---------------------------------------------------------------- memory of the whole command tree

_HOG = "python3 -c \"import time; b = b'1' * ({mib} << 20); time.sleep({sleep})\""


@as_root
def test_memory_of_the_whole_tree_is_capped(workspace: Path) -> None:
    limits = SandboxLimits(timeout_s=20, memory_bytes=1 << 30, tree_memory_bytes=128 << 20)
    with BwrapSandbox(workspace, limits) as box:
        alone = box.run(_HOG.format(mib=48, sleep=0))
        assert alone.ok and alone.oom_kills == 0, alone
        hogs = " & ".join([_HOG.format(mib=48, sleep=1)] * 4)  # 4 x 48 MiB: each under RLIMIT_AS, together over
        tree = box.run(f"{hogs} & wait")
        single = box.run(_HOG.format(mib=300, sleep=0))
    assert tree.oom_kills >= 1 and "tree_memory_bytes" in tree.stderr, tree
    assert single.exit_code == 137 and single.oom_kills == 1 and "SIGKILL" in single.stderr, single


@as_root
def test_no_memory_cgroup_as_root_is_a_clear_error(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pids_only = {"pids": sandbox_module.cgroup_parents()["pids"]}
    monkeypatch.setattr(sandbox_module, "cgroup_parents", lambda: pids_only)
    with pytest.raises(SandboxError, match="tree_memory_bytes=None"):
        BwrapSandbox(workspace)
    with BwrapSandbox(workspace, SandboxLimits(tree_memory_bytes=None)) as box:
        assert box.run("true").ok
    with pytest.raises(ConfigurationError, match="tree_memory_bytes"):
        BwrapSandbox(workspace, SandboxLimits(tree_memory_bytes=1 << 20))


# ---------------------------------------------------------------- disk: the workspace quota

QUOTA = SandboxLimits(timeout_s=20, workspace_bytes=8 << 20, workspace_inodes=500)


@as_root
def test_workspace_quota_bounds_bytes_and_files(tmp_path: Path) -> None:
    workspace = create_workspace("quota-", QUOTA, parent=tmp_path)
    try:
        assert mounted(workspace) and quota_enforced(QUOTA)
        with BwrapSandbox(workspace, QUOTA) as box:
            big = box.run("head -c 16000000 /dev/zero > big")
            many = box.run("python3 -c \"[open(f'f{i}', 'w').close() for i in range(1000)]\"")
        assert big.exit_code != 0 and "No space left on device" in big.stderr, big
        assert (workspace / "big").stat().st_size <= 8 << 20
        assert many.exit_code != 0 and "No space left on device" in many.stderr, many
        assert len(os.listdir(workspace)) < 500
    finally:
        release_workspace(workspace)
    assert not workspace.exists() and not mounted(workspace)


def test_without_a_byte_cap_the_workspace_is_a_plain_directory(tmp_path: Path) -> None:
    limits = SandboxLimits(workspace_bytes=None)
    workspace = create_workspace("plain-", limits, parent=tmp_path)
    assert workspace.is_dir() and not mounted(workspace) and not quota_enforced(limits)
    release_workspace(workspace)
    assert not workspace.exists()
    with pytest.raises(ConfigurationError, match="workspace_inodes"):
        create_workspace("bad-", SandboxLimits(workspace_inodes=0), parent=tmp_path)


class _ScratchEnv(ShellTaskEnv):
    """The smallest ShellTaskEnv: one task, an empty workspace, graded by nothing."""

    kind = "scratch"

    def _default_suite(self):
        return {"t": SimpleNamespace(task_id="t")}

    def _prepare_workspace(self, workspace: Path) -> None:
        (workspace / "start.txt").write_text("start")

    def _setup_in_sandbox(self, sandbox) -> None:
        pass

    def _grade(self) -> GradeReport:
        return GradeReport(reward=0.0, detail="ungraded")


@as_root
def test_task_env_workspaces_are_quota_mounts_released_with_the_episode() -> None:
    env = _ScratchEnv(limits=QUOTA)
    try:
        env.reset(task_id="t")
        workspace = env.workspace
        assert mounted(workspace)
        observation = env.run_shell("cat start.txt; head -c 16000000 /dev/zero > big")
        assert "start" in observation and "No space left on device" in observation and env.infra_error is None
        long = env.run_shell("echo " + "y" * (300 << 10) + " | wc -c")  # used to be an infrastructure failure
        assert long.startswith("exit_code: 0") and env.infra_error is None, long
    finally:
        env.close()
    assert not workspace.exists() and not mounted(workspace)



def test_a_users_task_answers_under_a_bound_prefix_are_hidden_from_agent_and_grader() -> None:
    """A terminal task suite installed under the interpreter's prefix (bound read-only in every sandbox): the
    verifier file is unreadable to the agent's commands and to the grading run's programs, while grading works."""
    import dataclasses
    import sys
    import tempfile

    from trl_thundersync.envs.environments.terminal import TerminalTaskEnv
    from trl_thundersync.envs.tasks.suites import load_terminal_suite

    bundled = load_terminal_suite()["greet_script"]
    suite_dir = Path(tempfile.mkdtemp(prefix="ts-user-suite-", dir=sys.prefix))
    try:
        suite_dir.chmod(0o755)  # installed like a package: world-readable
        verifier = suite_dir / "test_outputs.py"
        shutil.copy2(bundled.verifier_file, verifier)
        verifier.chmod(0o644)
        task = dataclasses.replace(bundled, verifier_file=verifier)
        env = TerminalTaskEnv(tasks=[task], limits=SandboxLimits(timeout_s=20))
        try:
            env.reset(task_id=task.task_id)
            seen = env.run_shell(f"cat {verifier}")
            assert "def test" not in seen and not seen.startswith("exit_code: 0"), seen  # masked: no content
            assert "exit_code: 0" in env.run_shell(f"cat {suite_dir.parent / 'pyvenv.cfg'} || ls {sys.prefix}")
            # a script the verifier's checks run: it prints the verifier if it can read it
            env.run_shell(f"mkdir -p bin && printf '#!/bin/sh\\ncat {verifier} > leaked.txt 2>&1\\n' > bin/greet.sh"
                          " && chmod +x bin/greet.sh")
            reward = env.get_reward()
            assert reward is not None and reward < 1.5 and env.infra_error is None
        finally:
            env.close()
    finally:
        shutil.rmtree(suite_dir)


@as_root
def test_grading_copies_get_the_workspace_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graded code writes into the grading copy: as root that copy is a capped tmpfs like the workspace."""
    from trl_thundersync.envs.environments.swe import SWERepairEnv
    from trl_thundersync.envs.runtimes import make_sandbox

    seen: list[bool] = []

    def factory(workspace: Path, limits: SandboxLimits):
        seen.append(mounted(workspace))
        return make_sandbox(workspace, limits=limits)

    env = SWERepairEnv(limits=QUOTA, sandbox_factory=factory)
    try:
        env.reset(task_id="slugify_separators")
        assert env.get_reward() == 0.0  # the no-op attempt, graded in a mounted copy
    finally:
        env.close()
    assert len(seen) >= 2 and all(seen), seen  # the episode's workspace, then every grading copy
