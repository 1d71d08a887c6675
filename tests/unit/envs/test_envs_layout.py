"""The layout of `trl_thundersync.envs`: layers that depend one way, one errors module, no old import paths left.

Layers (envs/__init__.py): harness/ stands alone; runtimes/ needs only the errors; tasks/ (task data) may use
runtimes/; environments/ may use both; suites/ (one record per task suite) may use every layer below it. The
modules that once re-exported the moved names from the top of envs/ are gone: only `__init__.py` and `errors.py`
live there.
Pure: reads source files and imports modules, no sandbox or model.
Run: python -m pytest tests/unit/envs/test_envs_layout.py -q
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import trl_thundersync.envs as envs_package
from trl_thundersync.errors import ThunderSyncError

ENVS = Path(envs_package.__file__).parent
PREFIX = "trl_thundersync.envs"

# the module paths of envs/ before the split into layers (now envs.harness.*, envs.runtimes.*, envs.environments.*,
# envs.suites.validate)
MOVED = ("agent_loop", "trl_tool_loop", "sandbox_api", "sandbox", "swe", "terminal", "validate")
LAYERS = ("harness", "runtimes", "tasks", "environments", "suites")
# layer -> the envs subpackages and top-level modules it may import
ALLOWED = {
    "harness": {"harness"},
    "runtimes": {"runtimes", "errors"},
    "tasks": {"tasks", "runtimes", "errors"},
    "environments": {"environments", "tasks", "runtimes", "errors"},
    "suites": {"suites", "environments", "tasks", "runtimes", "harness", "errors"},
}


def public_names(module_file: Path) -> set[str]:
    """Top-level public names a module defines itself (functions, classes, assignments), read from its source."""
    names: set[str] = set()
    for node in ast.parse(module_file.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def envs_imports(module_file: Path) -> set[str]:
    """The `trl_thundersync.envs.X...` modules a source file imports (relative imports resolved), as 'X...'."""
    package = ".".join(module_file.relative_to(ENVS.parent.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(module_file.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            modules = [".".join([*base, node.module] if node.module else base)]
            if node.module is None:  # `from . import x`: each name is a module
                modules = [f"{modules[0]}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found.update(m[len(PREFIX) + 1 :] for m in modules if m.startswith(PREFIX + "."))
    return found


@pytest.mark.parametrize("old", MOVED)
def test_the_old_paths_are_gone(old: str) -> None:
    assert not (ENVS / f"{old}.py").exists()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{PREFIX}.{old}")


def test_the_top_of_envs_holds_only_the_package_and_its_errors() -> None:
    assert {p.name for p in ENVS.glob("*.py")} == {"__init__.py", "errors.py"}
    assert {p.name for p in ENVS.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(LAYERS)


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_imports_only_the_layers_below_it(layer: str) -> None:
    for path in sorted((ENVS / layer).glob("*.py")):
        used = {name.split(".")[0] for name in envs_imports(path)}
        assert used <= ALLOWED[layer], f"{path.relative_to(ENVS)} imports envs.{sorted(used - ALLOWED[layer])}"


def test_the_layers_never_import_an_old_path() -> None:
    for layer in LAYERS:
        for path in sorted((ENVS / layer).glob("*.py")):
            old = {name for name in envs_imports(path) if name in MOVED}
            assert not old, f"{path.relative_to(ENVS)} imports the re-export module(s) envs.{sorted(old)}"


def test_sandbox_and_task_errors_live_in_one_module_and_are_the_same_classes_everywhere() -> None:
    from trl_thundersync.envs import errors, runtimes, tasks
    from trl_thundersync.envs.runtimes import api
    from trl_thundersync.envs.tasks import grading

    classes = {name: getattr(errors, name) for name in public_names(ENVS / "errors.py")}
    assert set(classes) == {"SandboxError", "TaskFormatError", "UnknownTaskError", "TaskSetupError",
                            "UngradableWorkspace"}
    assert all(issubclass(cls, ThunderSyncError) for cls in classes.values())
    for module in (runtimes, api):
        assert module.SandboxError is errors.SandboxError
    for name in ("TaskFormatError", "UnknownTaskError", "TaskSetupError"):
        assert getattr(tasks, name) is classes[name]
    assert grading.UngradableWorkspace is errors.UngradableWorkspace
    for path in sorted(ENVS.glob("*/*.py")):  # no other module of the layers defines an exception class
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b) for b in node.bases}
                where = f"{path.relative_to(ENVS)}: {node.name}"
                assert not any("Error" in b or "Exception" in b for b in bases), where


def test_the_sandbox_hides_exactly_the_task_data_the_wheel_ships() -> None:
    import tomllib

    from trl_thundersync.envs.runtimes import mounts
    from trl_thundersync.envs.tasks.suites import tasks_root

    pyproject = ENVS.parent.parent / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("an installed package: no pyproject.toml next to it")
    package_data = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]
    shipped = {f"envs/tasks/{pattern.split('/')[0]}" for pattern in package_data[f"{PREFIX}.tasks"]}
    assert set(mounts._TASK_DATA) == shipped
    assert mounts._PACKAGE_DIR == ENVS.parent.resolve()
    for folder in shipped:
        assert (mounts._PACKAGE_DIR / folder).is_dir() and (tasks_root() / folder.split("/")[-1]).is_dir()
