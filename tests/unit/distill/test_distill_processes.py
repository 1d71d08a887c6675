"""The distillation barrier across processes (`distill.processes`) without processes: hand-made shares, as the
exchange would return them on every process."""

from __future__ import annotations

import pytest
import torch

from trl_thundersync.distill.normalizer import StepNormalizer, step_loss, step_normalizer
from trl_thundersync.distill.processes import (
    batch_metrics,
    check_shares,
    failed_share,
    finished_share,
    global_loss,
    local_share,
)
from trl_thundersync.distill.records import DistillTotals
from trl_thundersync.errors import NoScoredTokensError, PeerProcessError, TeacherScoringError
from trl_thundersync.streaming.learner_records import TeacherLoad
from trl_thundersync.types import AgentStats


def _totals(tokens: int, loss: float, turns: int, peak: int = 1) -> DistillTotals:
    return DistillTotals((torch.zeros(2),), tokens, loss, turns, 2, (), peak)


def _agent(turns: int, calls: int, wall: float) -> AgentStats:
    return AgentStats(turns=turns, tool_calls=calls, tool_failures=0, parse_errors=0, observation_truncations=0,
                      tool_intervals=((0.0, 0.1),) * calls, turn_intervals=(), wall_seconds=wall,
                      stop_reason="answered")


def _share(rank, tokens, loss, turns, *, wall=1.0, lengths=(3, 4), agents=(), engine=None, peak=1, items=None):
    timing = {"thundersync/step_wall_seconds": wall, "thundersync/learner_busy_seconds": wall / 2}
    return finished_share(rank, _totals(tokens, loss, turns, peak=peak), timing, lengths, agents, engine or {},
                          teacher_wait=0.1 * turns,
                          teacher=TeacherLoad(requests=turns, prefill_tokens=10 * turns, busy_seconds=0.2 * turns,
                                              turn_schedule_tokens=10 * turns, trajectory_schedule_tokens=4 * turns),
                          num_items=items)


def test_local_share_averages_to_the_global_token_normalized_direction():
    g0, g1 = torch.tensor([1.0, -2.0, 4.0]), torch.tensor([3.0, 0.5, 0.0])
    n0, n1 = 7, 0  # unequal shares, one of them empty
    world = [_share(0, n0, 0.0, 1), _share(1, n1, 0.0, 1)]
    norms = [step_normalizer("scored_tokens", world, r, label="s") for r in (0, 1)]
    shares = [local_share([g], norms[r].share_scale()) for r, g in enumerate((g0, g1))]
    mean = (shares[0] + shares[1]) / 2  # what the placement's all-reduce hands the optimizer
    assert torch.allclose(mean, (g0 + g1) / (n0 + n1), rtol=1e-7)
    one = step_normalizer("scored_tokens", [_share(0, 7, 0.0, 1)], 0, label="s")
    assert torch.allclose(local_share([g0], one.share_scale()), g0 / 7, rtol=1e-7, atol=0)  # Σ g / N


@pytest.mark.parametrize("name", ["scored_tokens", "num_items_in_batch"])
def test_zero_tokens_on_every_process_is_refused_under_either_normalizer(name):
    shares = [_share(0, 0, 0.0, 1, items=9.0), _share(1, 0, 0.0, 1, items=9.0)]
    check_shares(shares, 0, None)
    for rank in (0, 1):  # every process raises, naming the step
        with pytest.raises(NoScoredTokensError, match=r"step 4 \(policy version 3\): .*zero scored completion"):
            step_normalizer(name, shares, rank, label="optimizer step 4 (policy version 3)")


def test_num_items_in_batch_is_stock_gkds_divisor_and_scale():
    g0, g1 = torch.tensor([1.0, -2.0, 4.0]), torch.tensor([3.0, 0.5, 0.0])
    # gathered over processes (average_tokens_across_devices): every process holds the global count 33 and divides
    # its own sum by it; DDP's mean then gives Σ g / (2 · 33), stock GKDTrainer's step on two processes
    shared = [_share(0, 20, 2.0, 1, items=33.0), _share(1, 5, 1.0, 1, items=33.0)]
    norms = [step_normalizer("num_items_in_batch", shared, r, label="s") for r in (0, 1)]
    assert norms[0] == StepNormalizer("num_items_in_batch", 33.0, 1.0, None)
    mean = (local_share([g0], norms[0].share_scale()) + local_share([g1], norms[1].share_scale())) / 2
    assert torch.allclose(mean, (g0 + g1) / (2 * 33), rtol=1e-7)  # not / 25, the scored tokens
    assert step_loss(shared, lambda r: norms[r]) == pytest.approx(3.0 / 33 / 2)
    # backwards already seeded with 1/33 (the count is known before the batch): nothing left to scale
    assert norms[0].share_scale(seeded_by=33.0) == 1.0 and norms[0].share_scale(seeded_by=11.0) == 1.0 / 3
    # per-process counts (average_tokens_across_devices=False): the mean of Σ_r g / N_r, as stock DDP averages
    own = [_share(0, 20, 2.0, 1, items=10.0), _share(1, 5, 1.0, 1, items=4.0)]
    norms = [step_normalizer("num_items_in_batch", own, r, label="s") for r in (0, 1)]
    mean = (local_share([g0], norms[0].share_scale()) + local_share([g1], norms[1].share_scale())) / 2
    assert torch.allclose(mean, (g0 / 10 + g1 / 4) / 2, rtol=1e-7)
    assert step_loss(own, lambda r: norms[r]) == pytest.approx((2.0 / 10 + 1.0 / 4) / 2)
    # the scored-token normalizer (DistillationTrainer's) is the one-process step on any number of processes
    scored = [step_normalizer("scored_tokens", shared, r, label="s") for r in (0, 1)]
    mean = (local_share([g0], scored[0].share_scale()) + local_share([g1], scored[1].share_scale())) / 2
    assert torch.allclose(mean, (g0 + g1) / 25, rtol=1e-7)


def test_num_items_in_batch_of_zero_is_refused_and_none_falls_back():
    zero = [_share(0, 5, 1.0, 1, items=0.0), _share(1, 3, 1.0, 1, items=0.0)]
    with pytest.raises(NoScoredTokensError, match=r"step 2: num_items_in_batch=0 on process 0"):
        step_normalizer("num_items_in_batch", zero, 1, label="step 2")
    none = [_share(0, 5, 1.0, 1), _share(1, 3, 1.0, 1)]
    norm = step_normalizer("num_items_in_batch", none, 0, label="s")
    assert (norm.name, norm.tokens, norm.factor) == ("scored_tokens", 8.0, 2.0)
    assert "no num_items_in_batch" in norm.fallback


def test_a_failed_process_is_named_on_the_others_and_re_raised_on_itself():
    own = TeacherScoringError("teacher died")
    shares = [_share(0, 5, 1.0, 2), failed_share(1, own)]
    with pytest.raises(PeerProcessError, match=r"learner process 1 of 2 .* process 0 .*TeacherScoringError: teacher"):
        check_shares(shares, 0, None)
    with pytest.raises(TeacherScoringError, match="teacher died"):
        check_shares(shares, 1, own)
    assert check_shares([_share(0, 5, 1.0, 2), _share(1, 3, 0.5, 1)], 0, None) == 8


def test_metrics_are_those_of_the_global_batch():
    agents0, agents1 = (_agent(2, 1, 0.5), _agent(3, 2, 0.7)), (_agent(4, 3, 0.9), _agent(1, 0, 0.1))
    shares = [_share(0, 6, 1.2, 5, wall=2.0, lengths=(2, 4), agents=agents0, engine={"rollout/x": 1.0}, peak=2),
              _share(1, 2, -0.4, 5, wall=3.0, lengths=(1, 1), agents=agents1, engine={"rollout/x": 3.0}, peak=1)]
    m = batch_metrics(shares, "opd")
    whole = batch_metrics([_share(0, 8, 0.8, 10, wall=3.0, lengths=(2, 4, 1, 1), agents=agents0 + agents1,
                                  engine={"rollout/x": 2.0}, peak=2)], "opd")
    assert m == pytest.approx(whole)  # as one process streaming the same trajectories would log them
    assert m["thundersync/scored_tokens"] == 8 and m["thundersync/turns"] == 10
    assert m["opd/reverse_kl"] == pytest.approx(0.1) == global_loss(shares)
    assert m["completions/mean_length"] == 2.0 and m["agent/turns_mean"] == 2.5 and m["tools/call_frequency"] == 1.5
    assert m["thundersync/step_wall_seconds"] == 3.0  # the slowest process's
    assert m["thundersync/teacher_scoring_seconds"] == pytest.approx(0.2)
    assert m["thundersync/teacher_requests"] == 10 and m["thundersync/teacher_prefill_tokens"] == 100  # summed
    assert m["thundersync/teacher_prefill_tokens_trajectory_schedule"] == 40
    assert "opd/reverse_kl" not in batch_metrics(shares, "gjsd")
