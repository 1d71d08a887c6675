"""`benchmarks/sandbox_cost.py` on a few calls: both launchers run and agree on the output (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from benchmarks.sandbox_cost import main
from trl_thundersync.envs.runtimes import launcher


@pytest.mark.skipif(not launcher.shell_launcher_available(), reason="no /usr/bin/prlimit or bash >= 4.1 here")
def test_both_launchers_are_timed_and_print_the_same(tmp_path, capsys):
    out = tmp_path / "cost.json"
    result = main(["--calls", "2", "--rounds", "1", "--out", str(out)])
    assert result["same_output"] and json.loads(out.read_text())["wall_ms"].keys() == {"shell", "python"}
    assert all(v > 0 for v in result["wall_ms"].values())
    assert launcher.shell_launcher_argv.__name__ == "shell_launcher_argv"  # the choice is restored afterwards
    assert "machine CPU" in capsys.readouterr().out
