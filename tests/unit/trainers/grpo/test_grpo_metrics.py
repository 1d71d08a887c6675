"""GRPO batch metrics over several processes (`trainers/grpo/metrics.py`): a batch split over two fake processes
logs, on each of them, what one process logs for the whole batch and what TRL's formulas give on the gathered
tensors. The fake world exchanges payloads between threads, as `gather_object` does between processes."""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from trl.trainer.utils import nanstd

from tests.fixtures.batch_logs import NAMES, RANK0, RANK1, SETTINGS, counts
from trl_thundersync.envs.harness.metrics import length_metrics, truncation_flags
from trl_thundersync.trainers.grpo.metrics import (
    MetricSettings,
    ProcessBatchLog,
    batch_metrics,
    batch_tokens,
    completions_table,
    gather_logs_of,
    micro_batch_counts,
    record_batch,
)


def one_process() -> ProcessBatchLog:
    """The same global batch on one process."""
    a, b = RANK0, RANK1
    return ProcessBatchLog(
        rewards_per_func=a.rewards_per_func + b.rewards_per_func, rewards=a.rewards + b.rewards,
        advantages=a.advantages + b.advantages, prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        model_tokens=a.model_tokens + b.model_tokens, truncated=a.truncated + b.truncated,
        zero_std_rows=a.zero_std_rows + b.zero_std_rows,
        micro_batches=counts(*((x.tokens + y.tokens, x.rows + y.rows, x.positive_tokens + y.positive_tokens,
                                x.positive_rows + y.positive_rows, x.kl_sum + y.kl_sum)
                               for x, y in zip(a.micro_batches, b.micro_batches, strict=True))),
        agent=a.agent + b.agent,
        prompts=a.prompts + b.prompts, completions=a.completions + b.completions,
        extra={"judge": a.extra["judge"] + (None,) * 4},
        reported={"judge_seconds": (9.0, 3), "only_here": (1.0, 1)}, peak_stats_bytes=2 * 2**20,
        stats_bound_bytes=3 * 2**20, peak_held=3, turn_fallbacks=3,
    )


def test_two_processes_log_the_one_process_metrics_and_trl_formulas():
    two = batch_metrics([RANK0, RANK1], SETTINGS)
    one = batch_metrics([one_process()], SETTINGS)
    assert two.keys() == one.keys()
    for key in one:
        assert two[key] == pytest.approx(one[key], rel=1e-6, nan_ok=True), key
    # TRL's formulas on the gathered tensors (`_generate_and_score_completions`, `_generate`, `_compute_loss`)
    per_func = torch.tensor(RANK0.rewards_per_func + RANK1.rewards_per_func)
    rewards = torch.tensor(RANK0.rewards + RANK1.rewards)
    assert two["rewards/parity/mean"] == [torch.nanmean(per_func[:, 1]).item()]
    assert two["rewards/len/std"] == [nanstd(per_func[:, 0]).item()]
    assert two["reward"] == [torch.nanmean(rewards).item()] and two["reward_std"] == [nanstd(rewards).item()]
    assert two["frac_reward_zero_std"] == [2 / 8]
    assert two["kl"] == pytest.approx([1.25 / 11, 0.5 / 11])  # one global value per micro-batch
    assert two["clip_ratio/region_mean"] == two["clip_ratio/high_max"] == [0.0, 0.0]  # ratio ≡ 1 in the pass
    lengths = torch.tensor(RANK0.model_tokens + RANK1.model_tokens, dtype=torch.float32)
    cut = torch.tensor(RANK0.truncated + RANK1.truncated)
    assert two["completions/mean_length"] == [lengths.mean().item()]
    assert two["completions/max_length"] == [8.0] and two["completions/min_length"] == [1.0]
    assert two["completions/clipped_ratio"] == [3 / 8]
    assert two["completions/mean_terminated_length"] == [lengths[~cut].mean().item()]
    # TRL's tools/*: calls per completion and failures per call, over every process's rows
    assert two["tools/call_frequency"] == [3 / 3] and two["tools/failure_frequency"] == [1 / 3]
    assert two["agent/tool_latency_p50"] == pytest.approx([0.3])  # median of all three latencies, not of ranks'
    assert two["agent/stop_answered"] == pytest.approx([2 / 3])
    assert two["judge_seconds"] == [9.0 / 3]  # TRL: Σ values / Σ counts (not the mean of the ranks' means, 2.25)
    assert two["only_here"] == [1.0]
    assert two["thundersync/stats_peak_mb"] == [2.0] and two["thundersync/buffered_peak"] == [3.0]
    assert two["thundersync/turn_fallbacks"] == [3.0]
    assert batch_tokens([RANK0, RANK1]) == sum(RANK0.prompt_tokens + RANK1.prompt_tokens) + int(lengths.sum())


def test_optional_metrics_follow_the_run():
    plain = [replace(RANK0, agent=()), replace(RANK1, agent=())]
    metrics = batch_metrics(plain, replace(SETTINGS, lengths=False, release="reward", kl=False, loss_type="sapo"))
    assert "kl" not in metrics and not any(k.startswith(("completions/", "tools/", "agent/")) for k in metrics)
    assert not any(k.startswith(("clip_ratio/", "cispo")) for k in metrics)  # TRL logs none for sapo
    assert "thundersync/buffered_peak" not in metrics and "thundersync/turn_fallbacks" not in metrics


def test_cispo_clip_ratio_is_the_positive_advantage_share_below_one():
    """At ratio 1, TRL's `(coef_1 > ε_high) & (A > 0)` holds for every positive-advantage token when ε_high < 1."""
    cispo = replace(SETTINGS, loss_type="cispo", epsilon_high=0.5)
    assert batch_metrics([RANK0, RANK1], cispo)["cispo_clip_ratio"] == pytest.approx([3 / 11, 5 / 11])
    rows = batch_metrics([RANK0, RANK1], replace(cispo, sequence_level=True))  # GSPO-style: TRL counts rows
    assert rows["cispo_clip_ratio"] == pytest.approx([1 / 4, 1 / 4])
    assert batch_metrics([RANK0, RANK1], replace(cispo, epsilon_high=5.0))["cispo_clip_ratio"] == [0.0, 0.0]


def test_clip_extremes_are_nan_for_a_micro_batch_without_loss_tokens():
    empty = [replace(log, micro_batches=counts((0, 2, 0, 0, 0.0))) for log in (RANK0, RANK1)]
    metrics = batch_metrics(empty, SETTINGS)
    assert math.isnan(metrics["clip_ratio/low_min"][0]) and metrics["clip_ratio/low_mean"] == [0.0]
    assert metrics["kl"] == [0.0]


def test_completions_table_rows_of_every_process_in_rank_order():
    table = completions_table([RANK0, RANK1], NAMES)
    assert table["prompt"] == list(RANK0.prompts + RANK1.prompts)
    assert table["completion"] == list("abcdefgh")
    assert torch.tensor(table["rewards"]["len"]).nan_to_num(-1.0).tolist() == [3.0, 5.0, 2.0, 7.0, 1.0, -1.0, 4.0, 4.0]
    assert table["advantages"] == list(RANK0.advantages + RANK1.advantages)
    assert table["extra"] == {"judge": ["ok", None, "bad", None, None, None, None, None]}  # None on rank 1's rows


def test_length_metrics_match_trl_edge_cases():
    assert truncation_flags([(1, 2), (3, 0), ()], {0}) == [True, False, False]
    every_row_cut = length_metrics([3, 4], [True, True])
    assert every_row_cut["completions/mean_terminated_length"] == 0.0  # TRL's zeros(1) fallback
    assert every_row_cut["completions/clipped_ratio"] == 1.0
    assert length_metrics([], []) == {}


def test_micro_batch_counts_follow_trls_split():
    got = micro_batch_counts([1, 2, 3, 4], [0.5, -1.0, 0.0, 2.0], [0.5, 1.0, 2.0, 4.0], {0: 1, 1: 0, 2: 1, 3: 0}, 2)
    assert got == counts((6, 2, 4, 1, 5.0), (4, 2, 1, 1, 2.5))


class ThreadWorld:
    """`gather_object` between threads: each rank's call blocks until every rank has handed in its payload."""

    def __init__(self, size: int) -> None:
        self.slots: list = [None] * size
        self.barrier = threading.Barrier(size, timeout=10)

    def gather_of(self, rank: int):
        def gather(payload):
            self.slots[rank] = payload
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out

        return gather


def fake_trainer(trl_generation: bool = False):
    """The trainer fields `record_batch` writes (TRL's `_metrics`, `_logs`, `state`) and the run's metric settings
    (β = 0.1, grpo, ε_high 0.2, token-level, no vLLM correction)."""
    logs = {"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [],
            "extra": defaultdict(list)}
    settings = MetricSettings(NAMES, lengths=not trl_generation, release="content", kl=True, loss_type="grpo",
                              epsilon_high=0.2, sequence_level=False)
    return SimpleNamespace(_metrics={"train": defaultdict(list)}, _logs=logs, settings=settings,
                           state=SimpleNamespace(num_input_tokens_seen=100))


def record(trainer, log, gather) -> None:
    """`record_batch` as the trainer calls it: into its `_metrics["train"]`, `_logs` and token count."""
    trainer.state.num_input_tokens_seen = record_batch(log, gather, trainer.settings, trainer._metrics["train"],
                                                       trainer._logs, trainer.state.num_input_tokens_seen)


def test_every_rank_records_what_one_process_records():
    world, ranks = ThreadWorld(2), [fake_trainer(), fake_trainer()]
    threads = [threading.Thread(target=record, args=(t, log, world.gather_of(r)))
               for r, (t, log) in enumerate(zip(ranks, (RANK0, RANK1), strict=True))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    alone = fake_trainer()
    record(alone, one_process(), gather_logs_of(SimpleNamespace(num_processes=1)))
    tokens = 100 + batch_tokens([RANK0, RANK1])
    for trainer in ranks:
        assert trainer.state.num_input_tokens_seen == alone.state.num_input_tokens_seen == tokens
        assert trainer._metrics["train"]["num_tokens"] == [tokens]
        assert trainer._metrics["train"].keys() == alone._metrics["train"].keys()
        for key, values in alone._metrics["train"].items():
            assert trainer._metrics["train"][key] == pytest.approx(values, rel=1e-6, nan_ok=True), key
        assert trainer._logs["prompt"] == alone._logs["prompt"] and len(trainer._logs["advantages"]) == 8
        assert dict(trainer._logs["extra"]) == dict(alone._logs["extra"])


def test_trl_generation_keeps_trl_lengths_and_token_count():
    trainer = fake_trainer(trl_generation=True)
    record(trainer, RANK0, gather_logs_of(SimpleNamespace(num_processes=1)))
    assert trainer.state.num_input_tokens_seen == 100  # TRL's `_generate` counted them
    assert not any(k.startswith("completions/") for k in trainer._metrics["train"])
