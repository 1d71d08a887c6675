"""Two CPU processes (DDP over gloo): every metric ThunderSync logs, on every rank, is what stock TRL logs on the
same run — TRL's are computed on values gathered from both processes, so they are also the one-process values — and
so is the completions table (`trainers/grpo/metrics.py`)."""

from __future__ import annotations

import pytest

from tests.fixtures.ddp_parity import run_ddp_parity
from tests.fixtures.logged_metrics import same, timed

pytestmark = pytest.mark.slow

# Logged by TRL alone: its per-token entropy comes from the loss forward of each micro-batch, which ThunderSync's
# streamed backward does not report (ThunderSync logs `entropy` with the entropy bonus only).
TRL_ONLY = frozenset({"entropy"})
# What the `metrics` case must log on both sides (a metric that disappears from one fails the test)
EXPECTED = frozenset({
    "loss", "grad_norm", "learning_rate", "epoch", "num_tokens", "reward", "reward_std", "frac_reward_zero_std",
    "kl", "len_mod3_mean", *(f"clip_ratio/{k}" for k in ("low_mean", "high_mean", "region_mean", "low_min",
                                                             "high_max")),
    *(f"rewards/{f}/{s}" for f in ("reward_len", "reward_parity", "reward_logging")
                             for s in ("mean", "std")),
    *(f"completions/{k}" for k in ("mean_length", "min_length", "max_length", "clipped_ratio",
                                   "mean_terminated_length", "min_terminated_length", "max_terminated_length")),
})


def test_every_rank_logs_trls_metrics_and_completions_table(tmp_path, tiny_model_path):
    """β = 0.1 (kl: one global value per micro-batch), two micro-batches per step, a reward function that returns
    None on some rows and one that logs through `log_metric` / `log_extra`; 2 optimizer steps."""
    ref, got = run_ddp_parity(tmp_path, tiny_model_path, "metrics")
    assert len(ref["logs"]) == len(got["logs"]) == 2
    for rank, (theirs, ours) in enumerate(zip(ref["logs"], got["logs"], strict=True)):
        assert len(theirs["history"]) == len(ours["history"]) == 3  # two steps and the train summary
        for step, (a, b) in enumerate(zip(theirs["history"], ours["history"], strict=True)):
            if step < 2:
                assert EXPECTED <= a.keys() and EXPECTED <= b.keys(), (rank, step)
                assert a.keys() - b.keys() == TRL_ONLY, (rank, step)
                assert all(k.startswith("thundersync/") for k in b.keys() - a.keys()), (rank, step)
            for key in a.keys() & b.keys():
                if timed(key):  # wall-clock of different work (TRL's step generates, then learns)
                    continue
                assert same(b[key], a[key]), (rank, step, key, b[key], a[key])
        table_a, table_b = theirs["table"], ours["table"]
        assert len(table_b["prompt"]) == 8  # the whole global batch on every rank, as TRL gathers it
        for column in ("prompt", "completion", "advantages"):
            assert all(map(same, table_b[column], table_a[column])) and len(table_b[column]) == len(table_a[column])
        assert table_b["rewards"].keys() == table_a["rewards"].keys()
        for name, values in table_a["rewards"].items():
            assert all(map(same, table_b["rewards"][name], values)), name
        assert table_b["extra"] == table_a["extra"] and "len_mod3" in table_b["extra"]
    # ThunderSync's own non-timing metrics: the same on both ranks (memory maxima over processes)
    for a, b in zip(got["logs"][0]["history"][:2], got["logs"][1]["history"][:2], strict=True):
        for key in ("thundersync/stats_peak_mb", "thundersync/stats_bound_mb", "thundersync/buffered_peak",
                    "thundersync/policy_version"):
            assert a[key] == b[key], key
