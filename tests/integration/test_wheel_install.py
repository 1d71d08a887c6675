"""The package as users install it: a wheel outside the checkout, its task suites run under bubblewrap from there.

The wheel is built (`pip wheel --no-deps`) from a clean copy of the sources and installed with `--no-deps` (pip
byte-compiles it, as a user's install does); every command runs from a working directory outside the checkout, so
only the installed copy is importable (checked: the imported package lies in the install). Two layouts:

1. a fresh venv in a temporary folder:
   - inventory: every file of the bundled task data (pyproject's [tool.setuptools.package-data]) is in the installed
     copy with the checkout's bytes, and nothing else is (bytecode aside);
   - `python -m trl_thundersync.envs.suites.validate` on one task of each bundled suite: untouched it fails,
     with its reference solution it passes (the whole suites run from the checkout in
     tests/integration/test_task_suites.py);
   - a SWE and a terminal episode (`_PROBE`): `run_shell` runs in the sandbox (`hostname` is bubblewrap's), the SWE
     workspace holds the task's files only (no `__pycache__` from the install), an untouched workspace grades 0.0,
     the installed answers (reference solutions, hidden verifiers) are unreadable inside;
2. a user site: `pip install --user` (PYTHONUSERBASE in the temporary folder) for the system interpreter,
   /usr/bin/python3 (Debian's), whose prefix has no pytest: the wheel and pytest go to the user site only, so
   commands and the graders (`python3 -I`, which skips a user site) find pytest there or nowhere. The same episodes.
   Skipped (with the reason) where there is no such interpreter.

Why the venv is laid out so: installing torch & co. into it would take minutes, so it gets them from this
interpreter's site-packages through a `.pth` *path line*, which appends that directory to sys.path after the venv's
own site-packages without running the `.pth` files in it (this checkout's editable finder among them). The sandbox
binds only the interpreter's prefixes, not that directory, and the graders run pytest inside it: so pytest and its
dependencies, at this environment's versions, are installed into the fresh venv itself, as `pip install` would. The
environments and the validator import no torch, so the system interpreter needs none.
Skipped without bubblewrap unless THUNDERSYNC_REQUIRE_SANDBOX is set (CI), where a missing sandbox fails.
Measured on two shared cores (load ~3): 30-35 s in all; building the wheels 7-10 s, the venv case 15-18 s (of which
validation 4-5 s, the probe ~5 s, the installs ~5 s), the user-site case 7-8 s.
Run: python -m pytest tests/integration/test_wheel_install.py -q
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from trl_thundersync.envs.suites import get_suite

CHECKOUT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")  # a distribution's interpreter: `pip install --user` is how users add to it
# One task of each bundled suite for the validator (the quickest of each; any task id of the suite would do).
VALIDATED = {"swe": "bisect_insert_end", "terminal": "active_user_emails", "lookup": "lookup-train-data-0",
             "thermostat": "thermostat-train-high1-0"}

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.spawn,
    pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
                       reason="needs bubblewrap (Debian package `bubblewrap`)"),
]

# Run by the installed interpreter: one SWE and one terminal episode through the installed package; prints JSON.
_PROBE = textwrap.dedent("""\
    import json, sys
    import trl_thundersync
    from trl_thundersync.envs.environments.swe import SWERepairEnv
    from trl_thundersync.envs.environments.terminal import TerminalTaskEnv

    report = {"package": trl_thundersync.__file__}
    for kind, env_class, task_id in (("swe", SWERepairEnv, "bisect_insert_end"),
                                     ("terminal", TerminalTaskEnv, "active_user_emails")):
        with env_class() as env:
            env.reset(task_id=task_id)
            task = env.task
            if kind == "swe":  # a source file of the fix, and its bytecode from the install (it holds the fix too)
                files = [p for p in sorted(task.solution_dir.rglob("*")) if p.is_file()]
                answers = [next(p for p in files if "__pycache__" not in p.parts),
                           *[p for p in files if "__pycache__" in p.parts][:1]]
            else:
                answers = [task.verifier_file, task.verifier_file.parent / "solution.sh"]
            report[kind] = {
                "tree": env.run_shell("find . -mindepth 1 | sort"),
                "hostname": env.run_shell("hostname"),
                "pytest": env.run_shell("python3 -c 'import pytest; print(pytest.__file__)'"),
                "answers": {str(p): env.run_shell(f"cat {p}") for p in answers if p.is_file()},
                "reward": env.get_reward(),
                "infra_error": env.infra_error,
            }
    print(json.dumps(report))
""")


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:6]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def _is_bytecode(rel: Path) -> bool:
    return "__pycache__" in rel.parts or rel.suffix == ".pyc"


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary folder holding the wheel (`dist/`) and pytest's wheels (`pytest-wheels/`), made once per module."""
    tmp = tmp_path_factory.mktemp("wheel-build")
    source = tmp / "source"  # a clean copy: no stale build/ output of the checkout can leak into the wheel
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(CHECKOUT / name, source / name)
    shutil.copytree(CHECKOUT / "trl_thundersync", source / "trl_thundersync",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # pyproject's build requirement (setuptools>=68) already here: skip building an isolated environment for it
    major = int(importlib.metadata.version("setuptools").split(".")[0])
    isolation = ["--no-build-isolation"] if major >= 68 else []
    _run(_pip("wheel", "--no-deps", *isolation, "-w", str(tmp / "dist"), str(source)), cwd=tmp)
    # pytest and its dependencies at the versions installed here
    pins: dict[str, str] = {}
    for dist in importlib.metadata.distributions():  # in sys.path order: the first one is the importable one
        if name := dist.metadata["Name"]:
            pins.setdefault(name.lower().replace("_", "-"), dist.version)
    pins.pop("trl-thundersync", None)
    constraints = tmp / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    _run(_pip("wheel", "-c", str(constraints), "-w", str(tmp / "pytest-wheels"), f"pytest=={pins['pytest']}"),
         cwd=tmp)
    return tmp


def _wheel(build: Path) -> str:
    (wheel,) = (build / "dist").glob("trl_thundersync-*.whl")
    return str(wheel)


def _pytest_wheels(build: Path) -> list[str]:
    return sorted(map(str, (build / "pytest-wheels").glob("*.whl")))


def _fresh_venv(path: Path, build: Path) -> Path:
    """A venv without pip, with pytest installed and this interpreter's packages visible through a path line."""
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    _run([str(base_python), "-m", "venv", "--without-pip", str(path)], cwd=path.parent)
    python = path / "bin" / "python"
    _run(_pip("--python", str(python), "install", "--no-index", "--no-compile", "--no-deps", *_pytest_wheels(build)),
         cwd=path.parent)
    site_packages = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         cwd=path.parent).strip()
    # after installing pytest: pip would otherwise find this interpreter's pytest through the path line
    (Path(site_packages) / "zz-project-dependencies.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    return python


def _check_inventory(installed_package: Path) -> None:
    """The installed copy holds exactly the checkout's package data files (pyproject's globs), byte for byte."""
    package_data = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert package_data, "pyproject lists no package data"
    for package, patterns in package_data.items():
        relative = Path(*package.split(".")[1:])  # below trl_thundersync/
        sides = {}
        for name, root in (("checkout", CHECKOUT / "trl_thundersync" / relative),
                           ("installed", installed_package / relative)):
            files = {p.relative_to(root) for pattern in patterns for p in root.glob(pattern) if p.is_file()}
            sides[name] = {rel for rel in files if not _is_bytecode(rel)}
        checkout, installed = sides["checkout"], sides["installed"]
        assert checkout, (package, patterns)
        assert installed == checkout, (package, sorted(checkout - installed)[:10], sorted(installed - checkout)[:10])
        root = CHECKOUT / "trl_thundersync" / relative
        changed = [rel for rel in sorted(checkout)
                   if (root / rel).read_bytes() != (installed_package / relative / rel).read_bytes()]
        assert not changed, (package, changed[:10])


def _check_probe(report: dict, installed_under: Path) -> None:
    installed_under = installed_under.resolve()
    package = Path(report["package"]).resolve()
    assert package.is_relative_to(installed_under), package
    assert not package.is_relative_to(CHECKOUT), package
    repo = CHECKOUT / "trl_thundersync" / "envs" / "tasks" / "swe" / "bisect_insert_end" / "repo"
    expected_tree = sorted(f"./{p.relative_to(repo)}" for p in repo.rglob("*") if not _is_bytecode(p.relative_to(repo)))
    assert report["swe"]["tree"] == "exit_code: 0\nstdout:\n" + "\n".join(expected_tree), report["swe"]["tree"]
    for kind in ("swe", "terminal"):
        episode = report[kind]
        assert episode["infra_error"] is None, (kind, episode)
        assert episode["hostname"] == "exit_code: 0\nstdout:\nsandbox", (kind, episode["hostname"])  # bubblewrap's
        pytest_file = episode["pytest"].removeprefix("exit_code: 0\nstdout:\n")
        assert Path(pytest_file).is_relative_to(installed_under), (kind, episode["pytest"])
        assert episode["reward"] == 0.0, (kind, episode)
        assert episode["answers"], kind
        for path, seen in episode["answers"].items():
            assert Path(path).is_relative_to(installed_under), path
            assert not seen.startswith("exit_code: 0") and "stdout:" not in seen, (path, seen)


def _check_validation(table: str) -> None:
    """The validator's table: each chosen task failed untouched and got the full reward with its solution."""
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines() if "/" in line.split(" ")[0]}
    assert set(rows) == {f"{suite}/{task}" for suite, task in VALIDATED.items()}, table
    for name, (noop, solved, _seconds, status) in rows.items():
        full = get_suite(name.split("/")[0]).full_reward
        assert status == "ok" and float(noop) < full and float(solved) == full, (name, table)
    assert table.strip().splitlines()[-1].endswith("4 ok, 0 failed, 0 infrastructure errors"), table


def test_a_wheel_in_a_fresh_venv_ships_the_task_data_and_validates_every_suite(build: Path, tmp_path: Path) -> None:
    outside = tmp_path / "cwd"  # the working directory of every run: nothing importable in it
    outside.mkdir()
    venv = tmp_path / "venv"
    python = _fresh_venv(venv, build)
    _run(_pip("--python", str(python), "install", "--no-index", "--no-deps", _wheel(build)), cwd=outside)
    (installed,) = venv.glob("lib/python3*/site-packages/trl_thundersync")
    _check_inventory(installed)
    tasks = [arg for task in VALIDATED.values() for arg in ("--task", task)]
    table = _run([str(python), "-m", "trl_thundersync.envs.suites.validate", "--suite", "all", *tasks],
                 cwd=outside, env=_clean_env(), timeout=300)
    _check_validation(table)
    _check_probe(json.loads(_run([str(python), "-c", _PROBE], cwd=outside, env=_clean_env())), venv)


def _system_python_without_pytest() -> str | None:
    """Why /usr/bin/python3 cannot serve the user-site case here, or None when it can."""
    if not SYSTEM_PYTHON.is_file():
        return f"no {SYSTEM_PYTHON}"
    check = ("import importlib.util, site, sys; "
             "print(sys.version_info >= (3, 11), site.ENABLE_USER_SITE, importlib.util.find_spec('pytest') is None)")
    done = subprocess.run([str(SYSTEM_PYTHON), "-c", check], capture_output=True, text=True, env=_clean_env(),
                          cwd="/")
    if done.returncode != 0 or done.stdout.split() != ["True", "True", "True"]:
        return f"{SYSTEM_PYTHON} is not Python >= 3.11 with a user site and without pytest ({done.stdout.strip()})"
    return None


def test_a_wheel_in_the_user_site_of_a_system_python_runs_and_grades_in_the_sandbox(build: Path,
                                                                                      tmp_path: Path) -> None:
    if (reason := _system_python_without_pytest()) is not None:
        pytest.skip(reason)
    outside = tmp_path / "cwd"
    outside.mkdir()
    user_base = tmp_path / "user-base"
    user_env = _clean_env(PYTHONUSERBASE=str(user_base))
    # a throwaway user base in the temporary folder: nothing of the distribution's is touched (PEP 668's marker)
    _run(_pip("--python", str(SYSTEM_PYTHON), "install", "--user", "--break-system-packages", "--no-index",
              "--no-deps", "--no-warn-script-location", _wheel(build), *_pytest_wheels(build)),
         cwd=outside, env=user_env)
    _check_probe(json.loads(_run([str(SYSTEM_PYTHON), "-c", _PROBE], cwd=outside, env=user_env)), user_base)
