"""The package's edges (issue 12): the library never imports test fixtures or benchmarks, nothing outside tests/
imports tests, trainers never import each other, the wheel ships only the library, and the runnable code outside it
resolves."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "trl_thundersync"
TASK_DATA = ("envs/tasks/swe/", "envs/tasks/terminal/")  # bundled repositories graded inside the sandbox


def library_modules() -> list[Path]:
    return [p for p in sorted(LIBRARY.rglob("*.py")) if not any(d in p.as_posix() for d in TASK_DATA)]


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved against its package)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            names.add(".".join((*base, node.module or "")).strip("."))
    return names


def test_the_library_never_imports_test_fixtures_or_benchmarks():
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in imported_modules(p)
                                                  if n.split(".")[0] in {"tests", "benchmarks"})
                 for p in library_modules()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_outside_tests_imports_tests():
    # benchmarks/, scripts/ and examples/ run from a checkout; what they share with the tests lives in benchmarks/
    outside = [p for p in sorted(ROOT.rglob("*.py")) if p.relative_to(ROOT).parts[0] != "tests"
               and not p.relative_to(ROOT).parts[0].startswith(".") and not any(d in p.as_posix() for d in TASK_DATA)]
    assert {"benchmarks", "scripts", "examples", "trl_thundersync"} <= {p.relative_to(ROOT).parts[0] for p in outside}
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in imported_modules(p) if n.split(".")[0] == "tests")
                 for p in outside}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_test_modules_share_helpers_through_fixtures_not_through_each_other():
    # what several test modules use lives in tests/fixtures/ (or benchmarks/); a test module imports no other one
    tests = sorted((ROOT / "tests").rglob("*.py"))
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in imported_modules(p) if n.split(".")[0] == "tests"
                                                  and n.split(".")[-1].startswith("test_"))
                 for p in tests}
    assert {k: v for k, v in offenders.items() if v} == {}
    launched = [p.name for p in (ROOT / "tests" / "integration").glob("*_script.py") if not p.name.startswith("test_")]
    assert launched == []  # the programs the multi-process tests launch are fixtures


def test_the_unit_tests_mirror_the_package():
    # tests/unit/<folder>/ tests trl_thundersync/<folder>/ (benchmarks/ and scripts/: the runnable code outside it)
    unit = ROOT / "tests" / "unit"
    folders = {p.parent.relative_to(unit) for p in unit.rglob("test_*.py")} - {Path(".")}
    assert folders and all((LIBRARY / f).is_dir() or f.parts[0] in {"benchmarks", "scripts"} for f in folders), folders
    assert all((unit / f / "__init__.py").is_file() for f in folders)  # equal basenames in other folders stay distinct


def test_imports_are_resolved_the_way_this_test_reads_them():
    # the checks above would pass vacuously if relative or function-level imports were misread
    assert "trl_thundersync.rollout.engine" in imported_modules(LIBRARY / "trainers" / "grpo" / "trainer.py")
    assert "benchmarks.parity" in imported_modules(ROOT / "benchmarks" / "exactness.py")
    assert "benchmarks.parity" in imported_modules(ROOT / "benchmarks" / "time_to_quality.py")  # inside a function


def test_no_trainer_module_imports_another_trainers_module():
    trainers = {f"{p.parent.name}/{p.stem}": p for family in ("grpo", "gkd")
                for p in (LIBRARY / "trainers" / family).glob("*.py")}
    assert {"grpo/trainer", "gkd/trainer"} <= set(trainers)
    for name, path in trainers.items():
        family = name.split("/")[0]
        other = "gkd" if family == "grpo" else "grpo"
        wrong = [n for n in imported_modules(path) if n.startswith(f"trl_thundersync.trainers.{other}")]
        assert wrong == [], f"{name} imports {wrong}"


def test_the_wheel_ships_the_library_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["trl_thundersync*"]
    assert not (LIBRARY / "bench").exists() and not (LIBRARY / "scripts.py").exists()
    assert not (LIBRARY / "testing").exists()  # the tiny builders are `trl_thundersync.tiny`, fixtures in tests/


def test_no_module_of_the_library_only_re_exports_a_moved_one():
    moved = {str(p.relative_to(ROOT)) for p in library_modules()
             if (ast.get_docstring(ast.parse(p.read_text())) or "").startswith(("Moved to", "Moved:"))}
    assert moved == set()


# The only places that hold a trainer object itself: the trainers, TRL's callback that publishes after each step,
# and the examples' end-of-run reports (they read a finished trainer's args, accelerator and trace).
TAKES_THE_TRAINER = {"trainers/grpo/trainer.py", "trainers/gkd/trainer.py", "trainers/lifecycle.py",
                     "examples_support/reports.py"}


def test_no_library_module_below_the_trainers_takes_the_trainer():
    """Issue 27: helpers get a settings record and explicit callables, never `trainer` to read attributes from."""
    holders = set()
    for path in library_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)
                if any(a.arg == "trainer" for a in arguments):
                    holders.add(path.relative_to(LIBRARY).as_posix())
    assert holders <= TAKES_THE_TRAINER, sorted(holders - TAKES_THE_TRAINER)
    assert holders >= {"trainers/lifecycle.py"}  # the check reads parameters (a misread would pass vacuously)
