"""The distillation barrier across processes (`distill.processes`) without processes: hand-made shares, as the
exchange would return them on every process."""

from __future__ import annotations

import pytest
import torch

from trl_thundersync.distill.processes import (
    batch_metrics,
    check_shares,
    failed_share,
    finished_share,
    global_loss,
    local_share,
)
from trl_thundersync.distill.records import DistillTotals
from trl_thundersync.distill.teacher_schedule import TeacherLoad
from trl_thundersync.errors import NoScoredTokensError, PeerProcessError, TeacherScoringError
from trl_thundersync.types import AgentStats


def _totals(tokens: int, loss: float, turns: int, peak: int = 1) -> DistillTotals:
    return DistillTotals((torch.zeros(2),), tokens, loss, turns, 2, (), peak)


def _agent(turns: int, calls: int, wall: float) -> AgentStats:
    return AgentStats(turns=turns, tool_calls=calls, tool_failures=0, parse_errors=0, observation_truncations=0,
                      tool_intervals=((0.0, 0.1),) * calls, turn_intervals=(), wall_seconds=wall,
                      stop_reason="answered")


def _share(rank, tokens, loss, turns, *, wall=1.0, lengths=(3, 4), agents=(), engine=None, peak=1):
    timing = {"thundersync/step_wall_seconds": wall, "thundersync/learner_busy_seconds": wall / 2}
    return finished_share(rank, _totals(tokens, loss, turns, peak=peak), timing, lengths, agents, engine or {},
                          teacher_wait=0.1 * turns,
                          teacher=TeacherLoad(requests=turns, prefill_tokens=10 * turns, busy_seconds=0.2 * turns,
                                              turn_schedule_tokens=10 * turns, trajectory_schedule_tokens=4 * turns))


def test_local_share_averages_to_the_global_token_normalized_direction():
    g0, g1 = torch.tensor([1.0, -2.0, 4.0]), torch.tensor([3.0, 0.5, 0.0])
    n0, n1 = 7, 0  # unequal shares, one of them empty
    shares = [local_share([g0], n0 + n1, 2), local_share([g1], n0 + n1, 2)]
    mean = (shares[0] + shares[1]) / 2  # what the placement's all-reduce hands the optimizer
    assert torch.allclose(mean, (g0 + g1) / (n0 + n1), rtol=1e-7)
    assert torch.equal(local_share([g0], 7, 1), g0 / 7)  # one process: Σ g / N, unchanged


def test_zero_tokens_on_every_process_is_refused():
    with pytest.raises(NoScoredTokensError, match="zero scored action tokens"):
        local_share([torch.zeros(3)], check_shares([_share(0, 0, 0.0, 1), _share(1, 0, 0.0, 1)], 0, None), 2)


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
