"""The floor check every exactness test states its tolerance with (`tests/fixtures/floors.py`), and the CI pass that
reruns those tests under other CPU kernels (`scripts/kernel_passes.sh`, issue 39)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures.floors import FP32_SPACING, assert_within_floor

ROOT = Path(__file__).resolve().parents[2]


def counting(values: dict[str, float]):
    calls: list[str] = []

    def measure(name):
        def run():
            calls.append(name)
            return values[name]
        return run

    return {name: measure(name) for name in values}, calls


def test_reorderings_are_measured_only_until_the_error_fits():
    reorderings, calls = counting({"reversed": 1e-7, "rotated": 3e-7, "padded": 9e-7})
    measured = assert_within_floor(5e-7, reorderings)  # 2 × 1e-7 (< FP32 spacing) is not enough; 2 × 3e-7 is
    assert calls == ["reversed", "rotated"] and measured == {"reversed": 1e-7, "rotated": 3e-7}
    reorderings, calls = counting({"reversed": 1e-7})
    assert assert_within_floor(2 * FP32_SPACING, reorderings) == {} and calls == []  # FP32's spacing needs no run


def test_an_error_past_every_reordering_fails_naming_each_floor():
    reorderings, calls = counting({"reversed": 1e-7, "rotated": 3e-7, "padded": 2e-7})
    with pytest.raises(AssertionError, match=r"step 2 7e-07 > max\(0.0e\+00, 2 × floor 3e-07\).*reversed 1.00e-07, "
                                             r"rotated 3.00e-07, padded 2.00e-07"):
        assert_within_floor(7e-7, reorderings, what="step 2")
    assert calls == ["reversed", "rotated", "padded"]


def test_factor_and_fixed_tolerance():
    reorderings, _ = counting({"reversed": 3e-7})
    assert_within_floor(8e-7, reorderings, factor=3.0)
    with pytest.raises(AssertionError):
        assert_within_floor(8e-7, counting({"reversed": 3e-7})[0], factor=2.0)
    reorderings, calls = counting({"reversed": 3e-7})
    assert assert_within_floor(9e-6, reorderings, at_least=1e-5) == {} and calls == []


def test_a_reordering_that_changed_more_than_rounding_fails_the_test():
    with pytest.raises(AssertionError, match=r"the floor run 'padded' is 0.002 from stock TRL"):
        assert_within_floor(1e-3, counting({"reversed": 1e-7, "padded": 2e-3})[0])
    with pytest.raises(AssertionError, match="floor run 'reversed' is nan"):
        assert_within_floor(1e-3, counting({"reversed": float("nan")})[0])


def test_every_test_module_with_a_floor_is_in_the_exactness_layer():
    modules = [p for p in (ROOT / "tests" / "integration").glob("test_*.py")
               if re.search(r"assert_within_floor|FP32_SPACING|\bfloor\b", p.read_text())]
    assert modules
    unmarked = [p.name for p in modules if "pytest.mark.exactness" not in p.read_text()]
    assert unmarked == [], f"compare against a floor but are not rerun under other CPU kernels: {unmarked}"


def test_ci_reruns_the_exactness_layer_under_other_kernels():
    ci = (ROOT / ".ci" / "run").read_text()
    passes = (ROOT / "scripts" / "kernel_passes.sh").read_text()
    assert "bash scripts/kernel_passes.sh" in ci
    assert "-m exactness" in passes and "ATEN_CPU_CAPABILITY=$set" in passes and "MKL_ENABLE_INSTRUCTIONS" in passes
    assert "exactness:" in (ROOT / "pyproject.toml").read_text()  # the marker is registered
