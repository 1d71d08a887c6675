"""`benchmarks/learner_work.py` runs end to end on a small point: both variants compute the same group direction and
the shared prefix is counted once (no timing asserted)."""

from __future__ import annotations

import json

from benchmarks.learner_work import main


def test_learner_work_writes_rows_whose_variants_agree(tmp_path, capsys):
    out = tmp_path / "learner_work.json"
    main(["--prompts", "24", "--groups", "3", "--completion", "5", "--repeats", "1", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["relative_error"] <= 1e-5
    assert row["shared"]["token_passes"] == 24 + row["completion_tokens"]
    assert row["full"]["token_passes"] == 3 * 24 + row["completion_tokens"]
    assert row["flop_ratio"] < 1.0
    assert "GFLOP full" in capsys.readouterr().out


def test_learner_variants_through_the_wired_learner_agree(tmp_path, capsys):
    """`--learner`: full, shared, and both batched variants give the same group direction; the batched pass over the
    prefix ran as one pass of every member (its items carry `batched`), and its table is printed."""
    out = tmp_path / "learner_work.json"
    main(["--learner", "--prompts", "24", "--groups", "3", "--completion", "5", "--repeats", "1", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    for name in ("shared", "batched", "full_batched"):
        assert row[name]["relative_error"] <= 1e-5, name
    # the prefix once, then 3 rows padded to the longest completion (3 / 4 / 5 tokens): the padding is counted
    assert row["shared"]["token_passes"] == 24 + 3 + 4 + 5 and row["batched"]["token_passes"] == 24 + 3 * 5
    assert "full_batched" in capsys.readouterr().out
