"""The package as users install it: a wheel in a fresh venv outside the checkout, its task suites run under bubblewrap.

The wheel is built (`pip wheel --no-deps`) from a clean copy of the sources and installed with `--no-deps` into a
fresh venv in a temporary folder; every command runs from a working directory outside the checkout, so only the
installed copy is importable (checked: the imported package lies in the fresh venv). Through the environments, with
bubblewrap (`hostname` inside is the sandbox's):
- `python -m trl_thundersync.envs.validate --suite all`: every bundled task fails untouched and passes with its
  reference solution;
- a SWE and a terminal tool call: `run_shell("ls")` runs, an untouched workspace grades 0.0, and the installed
  copy's answers (reference solutions, hidden verifiers) are unreadable inside;
- the same tool calls with the wheel in a user site (`pip install --user`, PYTHONUSERBASE in the temporary folder).

Why the venv is laid out so: installing torch & co. into it would take minutes, so it gets them from this
interpreter's site-packages through a `.pth` *path line*, which appends that directory to sys.path after the venv's
own site-packages without running the `.pth` files in it (this checkout's editable finder among them). The sandbox
binds only the interpreter's prefixes, not that directory, and the graders run pytest inside it: so pytest and its
dependencies, at this environment's versions, are installed into the fresh venv itself, as `pip install` would.
Skipped without bubblewrap unless THUNDERSYNC_REQUIRE_SANDBOX is set (CI), where a missing sandbox fails.
About 20 s (build, venvs, installs, tool calls) plus the validation, which takes as long as
tests/integration/test_task_suites.py (84 s with the two cores shared and loaded, 134 s in all).
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
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.spawn,
    pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("THUNDERSYNC_REQUIRE_SANDBOX"),
                       reason="needs bubblewrap (Debian package `bubblewrap`)"),
]

# Run by the fresh venv's interpreter: one SWE and one terminal episode through the installed package; prints JSON.
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
            if kind == "swe":
                answers = [p for p in sorted(task.solution_dir.rglob("*")) if p.is_file()][:1]
            else:
                answers = [task.verifier_file, task.verifier_file.parent / "solution.sh"]
            report[kind] = {
                "ls": env.run_shell("ls"),
                "hostname": env.run_shell("hostname"),
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


def _build_wheel(tmp: Path) -> Path:
    """The wheel of a clean copy of the sources (no stale build/ output of the checkout can leak into it)."""
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(CHECKOUT / name, source / name)
    shutil.copytree(CHECKOUT / "trl_thundersync", source / "trl_thundersync",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # pyproject's build requirement (setuptools>=68) already here: skip building an isolated environment for it
    major = int(importlib.metadata.version("setuptools").split(".")[0])
    isolation = ["--no-build-isolation"] if major >= 68 else []
    _run(_pip("wheel", "--no-deps", *isolation, "-w", str(tmp / "dist"), str(source)), cwd=tmp)
    (wheel,) = (tmp / "dist").glob("trl_thundersync-*.whl")
    return wheel


def _pytest_wheels(tmp: Path) -> Path:
    """Wheels of pytest and its dependencies at the versions installed here, fetched once for every venv."""
    pins: dict[str, str] = {}
    for dist in importlib.metadata.distributions():  # in sys.path order: the first one is the importable one
        if name := dist.metadata["Name"]:
            pins.setdefault(name.lower().replace("_", "-"), dist.version)
    pins.pop("trl-thundersync", None)
    constraints = tmp / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    _run(_pip("wheel", "-c", str(constraints), "-w", str(tmp / "pytest-wheels"), f"pytest=={pins['pytest']}"),
         cwd=tmp)
    return tmp / "pytest-wheels"


def _fresh_venv(path: Path, pytest_wheels: Path, *, system_site: bool = False) -> Path:
    """A venv without pip, with pytest installed and this interpreter's packages visible through a path line."""
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    _run([str(base_python), "-m", "venv", "--without-pip", *(["--system-site-packages"] if system_site else []),
          str(path)], cwd=path.parent)
    python = path / "bin" / "python"
    _run(_pip("--python", str(python), "install", "--no-index", "--no-compile", "--no-deps",
              *map(str, sorted(pytest_wheels.glob("*.whl")))), cwd=path.parent)
    site_packages = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         cwd=path.parent).strip()
    # after installing pytest: pip would otherwise find this interpreter's pytest through the path line
    (Path(site_packages) / "zz-project-dependencies.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    return python


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def _check_probe(report: dict, installed_under: Path) -> None:
    package = Path(report["package"]).resolve()
    assert package.is_relative_to(installed_under.resolve()), package
    assert not package.is_relative_to(CHECKOUT), package
    for kind in ("swe", "terminal"):
        episode = report[kind]
        assert episode["infra_error"] is None, (kind, episode)
        assert episode["ls"].startswith("exit_code: 0\nstdout:\n"), (kind, episode["ls"])
        assert episode["hostname"] == "exit_code: 0\nstdout:\nsandbox", (kind, episode["hostname"])  # bubblewrap's
        assert episode["reward"] == 0.0, (kind, episode)
        assert episode["answers"], kind
        for path, seen in episode["answers"].items():
            assert Path(path).is_relative_to(installed_under.resolve()), path
            assert not seen.startswith("exit_code: 0") and "stdout:" not in seen, (path, seen)


def test_the_installed_wheel_validates_every_suite_and_runs_tools_in_the_sandbox(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    pytest_wheels = _pytest_wheels(tmp_path)
    outside = tmp_path / "cwd"  # the working directory of every run: nothing importable in it
    outside.mkdir()

    # 1. a fresh venv: the wheel in its site-packages
    venv = tmp_path / "venv"
    python = _fresh_venv(venv, pytest_wheels)
    _run(_pip("--python", str(python), "install", "--no-index", "--no-deps", str(wheel)), cwd=outside)
    _check_probe(json.loads(_run([str(python), "-c", _PROBE], cwd=outside, env=_clean_env())), venv)
    table = _run([str(python), "-m", "trl_thundersync.envs.validate", "--suite", "all"], cwd=outside,
                 env=_clean_env(), timeout=600)
    summary = table.strip().splitlines()[-1]
    total = int(summary.split()[0])
    assert total >= 100 and summary.endswith(f"{total} ok, 0 failed, 0 infrastructure errors"), table

    # 2. a user site: `pip install --user` (a venv with system site-packages has one; kept in the temporary folder)
    user_base = tmp_path / "user-base"
    user_python = _fresh_venv(tmp_path / "venv-user", pytest_wheels, system_site=True)
    user_env = _clean_env(PYTHONUSERBASE=str(user_base))
    _run(_pip("--python", str(user_python), "install", "--user", "--no-index", "--no-deps", "--no-warn-script-location",
              str(wheel)), cwd=outside, env=user_env)
    _check_probe(json.loads(_run([str(user_python), "-c", _PROBE], cwd=outside, env=user_env)), user_base)
