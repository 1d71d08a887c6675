"""The memory benchmarks' own arithmetic: the ladder's table and the paper-scale script's reading of a plan."""

from __future__ import annotations

import json

from benchmarks.memory_ladder import table
from benchmarks.paper_scale import MODELS, peaks, write_config


def test_the_ladder_table_prints_ratios_and_marks_what_is_missing():
    rows = [dict(size="1m", kind="sync", num_params=10, peak_rss=2**30, rss_before_train=2**29, plan_total=2**29,
                 plan_pending=2**28, caps=[None, None, "content"], params_rel_to_sync=0.0, peak_over_sync=1.0,
                 step_seconds=2.0, step_over_sync=1.0),
            dict(size="1m", kind="trl", num_params=10, peak_rss=2**30, rss_before_train=2**29, plan_total=None,
                 plan_pending=None, caps=None, params_rel_to_sync=1e-9, peak_over_sync=1.0, step_seconds=None,
                 step_over_sync=None)]
    lines = table(rows).splitlines()
    assert "plan/peak" in lines[0] and "step s" in lines[0]
    assert " 0.50 " in lines[1] and "2.000" in lines[1]  # plan over peak; the step time
    assert lines[2].rstrip().endswith("-")  # stock TRL: no plan, no step figure


def test_the_paper_scale_script_reads_both_peaks_of_a_plan(tmp_path):
    printed = ("  peak (device)        1.000 GB    2.000 GB     3.000 GB           thundersync/sync = 1.50x\n"
               "  peak (host)          0.0 MB      4.000 GB     5.000 GB           thundersync/sync = 1.25x\n")
    assert peaks(printed) == {"device": ["1.000 GB", "2.000 GB", "3.000 GB"],
                              "host": ["0.0 MB", "4.000 GB", "5.000 GB"]}
    assert peaks("  peak    7.0 MB    8.0 MB    9.0 MB  x")["device"] == ["7.0 MB", "8.0 MB", "9.0 MB"]
    config = json.loads((write_config(tmp_path / "8B", "8B") / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == MODELS["8B"][:2]
