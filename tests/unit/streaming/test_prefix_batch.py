"""The last members of a group learned as one padded pass over its shared prefix (`streaming/prefix_batch.py`,
`GRPOBatchLearner.submit_ready`, `coalesce.gather_members`): the batch direction equals the full passes' (policy and
β·KL per bucket, the entropy bonus per micro-batch, an unscorable member), the logged per-row values are the same, and
a group that cannot be batched (not complete, a member released at its content, a member that does not extend the
prompt) runs its members one by one."""

from __future__ import annotations

import math
import queue
import threading
from functools import partial

import pytest

from tests.fixtures.prefix_learning import G, _assert_same_terms, _batch, _forward, _learner, _model, _params
from trl_thundersync.streaming import prefix_batch
from trl_thundersync.streaming.coalesce import ReadyMembers, gather_members
from trl_thundersync.streaming.learner import GRPOBatchLearner
from trl_thundersync.streaming.normalization import LossNormalization
from trl_thundersync.streaming.pipeline import DONE, drain, tail_gather
from trl_thundersync.streaming.prefix_groups import PrefixGroups
from trl_thundersync.streaming.shared_prefix import pass_flop_counter
from trl_thundersync.streaming.source import TrajectoryBackward
from trl_thundersync.streaming.source_batch import chunk_rows, group_batch
from trl_thundersync.types import Rollout

OPTIONS = [dict(), dict(beta=0.1, entropy=0.5, temperature=0.7)]


def _ready_learner(batch, *, beta: float = 0.0, entropy: float | None = None, temperature: float = 1.0,
                   content: tuple[int, ...] = (), ready: list[list[int]] | None = None, finish: bool = True,
                   shared: bool = True, max_tokens: int = 2048):
    """The `_learner` of test_prefix_learner with the shared prefix, fed through `submit_ready` (`ready`: the index
    lists handed over together, in order; by default the whole batch at once, reversed); `content`: trajectories
    whose content is released first; `shared=False`: no prefix, the members batched as full sequences."""
    model, params = _model(temperature, 3), _params(temperature)
    norm = LossNormalization("grpo", batch_size=len(batch), micro_batches=2, max_completion_length=64)
    prefixes = PrefixGroups(model=model, params=params, group_size=G, max_open=len(batch) // G,
                            temperature=temperature, reference=_model(temperature, 4) if beta else None,
                            flops=pass_flop_counter(model, params)) if shared else None
    backward = TrajectoryBackward(
        params=params, logps_fn=_forward(False, temperature), normalization=norm, eos_and_pad=(7, 0),
        mask_truncated=False, beta=beta, ref_logps_fn=_forward(False, temperature, 4) if beta else None,
        logps_entropy_fn=_forward(True, temperature) if entropy is not None else None, entropy_coef=entropy,
        prefixes=prefixes, temperature=temperature)
    learner = GRPOBatchLearner(
        batch_size=len(batch), num_generations=G, num_params=sum(p.numel() for p in params), policy_version=0,
        scale_rewards="group", source_backward=backward, bucket_of=lambda i: i % 2, release="content",
        content_backward=backward.content, prefixes=prefixes,
        group_backward=partial(group_batch, backward, max_tokens=max_tokens),
        entropy_micro_batch_of=(lambda i: i % 2) if entropy is not None else None)
    for index in content:
        learner.submit_content(batch[index].rollout)
    for indices in ready if ready is not None else [list(reversed(range(len(batch))))]:
        learner.submit_ready([batch[i] for i in indices])
    return (learner, learner.finish()) if finish else learner


@pytest.mark.parametrize("shared", [True, False], ids=["over_prefix", "full_sequences"])
@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "kl_ent"])
def test_group_batch_matches_full_passes(options, shared):
    batch = _batch()
    _, full = _learner(batch, shared=False, release="reward", **options)
    learner, batched = _ready_learner(batch, shared=shared, **options)
    _assert_same_terms(batched, full)
    ran = [w for w in batched.work if w.kind == "trajectory"]
    # one pass per group, of its members with something to learn (plain: not the unscorable member 1, batched 0)
    assert len(ran) == len(batch)
    assert {(w.group, w.batched) for w in ran if w.index != 1} == {(0, G - 1 if not options else G), (1, G)}
    assert [w.batched for w in ran if w.index == 1] == [G if options else 0]
    assert batched.kl_sums == pytest.approx(full.kl_sums, rel=1e-5, abs=1e-6)
    assert batched.entropy_sums == pytest.approx(full.entropy_sums, rel=1e-5)
    assert batched.scored_tokens == full.scored_tokens
    for got, expected in zip(batched.policy_values, full.policy_values, strict=True):
        assert got == pytest.approx(expected, rel=1e-5) if expected is not None else got is None
    assert [r if not math.isnan(r) else None for r in batched.rewards] == \
        [r if not math.isnan(r) else None for r in full.rewards]
    assert not shared or (not learner.prefixes.open and not learner.prefixes.mismatched)
    # its items lie one after another (the pass's time shared by forwarded tokens) and are priced by the pass
    for a, b in zip(ran, ran[1:], strict=False):
        assert a.end <= b.start + 1e-9 or a.group != b.group
    for group in (0, 1):  # priced by the pass (a member with nothing to learn was not forwarded: no share); without
        items = [w for w in ran if w.group == group]  # a prefix, by each member's tokens as a full pass is
        if shared:
            assert sum(1 for w in items if w.flops > 0) == max(w.batched for w in items)
        else:
            assert all(w.flops is None for w in items)


def test_group_batch_runs_one_pass_per_group(monkeypatch):
    calls = []
    original = prefix_batch.members_pass
    monkeypatch.setattr("trl_thundersync.streaming.prefix_groups.members_pass",
                        lambda prefix, indices, *a: calls.append(list(indices)) or original(prefix, indices, *a))
    _ready_learner(_batch())
    assert sorted(map(sorted, calls)) == [[0, 2, 3], [4, 5, 6, 7]]  # (1 is unscorable: nothing to learn)


def test_a_member_released_at_content_binds_and_the_others_batch():
    """A member whose content ran already holds H_i: it binds as alone, and its group's other members (here 0 and 3;
    1 is unscorable) still run as one pass, the same update."""
    batch = _batch()
    _, full = _learner(batch, shared=False, release="reward")
    _, mixed = _ready_learner(batch, content=(2,))
    _assert_same_terms(mixed, full)
    assert [w.index for w in mixed.work if w.kind in ("content", "bind")] == [2, 2]
    assert {w.index: w.batched for w in mixed.work if w.kind == "trajectory" and w.group == 0} == {0: 2, 1: 0, 3: 2}


@pytest.mark.parametrize("shared", [True, False], ids=["over_prefix", "full_sequences"])
def test_mismatched_member_and_incomplete_groups_run_one_by_one(shared):
    batch = _batch(rewrite=5)  # group 1's member 5 has another prompt: group 1 cannot batch
    _, full = _learner(batch, shared=False, release="reward")
    learner, totals = _ready_learner(batch, shared=shared)
    _assert_same_terms(totals, full)
    assert {w.batched for w in totals.work if w.kind == "trajectory" and w.group == 1} == {1}
    assert {w.batched for w in totals.work if w.kind == "trajectory" and w.group == 0} == {G - 1, 0}
    assert not shared or 5 in learner.prefixes.mismatched
    # members handed over in pieces: only a piece that completes its group is batched
    batch = _batch()
    _, full = _learner(batch, shared=False, release="reward")
    _, totals = _ready_learner(batch, ready=[[0, 4], [5, 1], [2, 3], [6], [7]])
    _assert_same_terms(totals, full)
    assert {w.index: w.batched for w in totals.work if w.kind == "trajectory"} == {
        0: 1, 4: 1, 5: 1, 1: 1, 2: 2, 3: 2, 6: 1, 7: 1}


def test_gather_members_merges_each_groups_scored_items_and_drops_their_content():
    batch = _batch()
    a, b, c, d = batch[0], batch[1], batch[4], batch[2]
    content = Rollout(index=2, group=0, policy_version=0, prompt_ids=(1,), completion_ids=(2,))
    other = Rollout(index=5, group=1, policy_version=0, prompt_ids=(1,), completion_ids=(2,))
    every = lambda group, indices: True  # noqa: E731
    out = gather_members([a, content, other, c, b, d], every)
    assert out[0] == ReadyMembers((a, b, d)) and out[1] is other and out[2] is c and len(out) == 3
    # only where the learner says they complete their group: otherwise nothing moves, content included
    assert gather_members([a, content, other, c, b, d], lambda group, indices: False) == [a, content, other, c, b, d]
    assert gather_members([a, content, b], lambda group, indices: len(indices) == 3) == [a, content, b]
    failure = RuntimeError("producer failed")
    out = gather_members([a, failure, b], every)  # nothing crosses a failure
    assert out == [a, failure, b]


def test_drain_hands_ready_members_over_together():
    batch = _batch()
    inbox: queue.Queue = queue.Queue()
    for source in batch[:G]:
        inbox.put(source)
    inbox.put(DONE)
    seen = []
    gather = partial(gather_members, completes=lambda group, indices: len(indices) == G)
    arrived = drain(inbox, threading.Event(), seen.append, gather)
    assert seen == [ReadyMembers(tuple(batch[:G]))] and arrived == batch[:G]


def test_completes_group_counts_what_the_group_still_needs():
    batch = _batch(groups=3)
    fresh = _ready_learner(batch, ready=[], finish=False)  # nothing handed over yet
    assert fresh.completes_group(0, range(G)) and not fresh.completes_group(0, range(1, G))
    fresh.submit(batch[0])
    assert fresh.completes_group(0, range(1, G)) and not fresh.completes_group(0, range(G))
    fresh.submit_content(batch[4].rollout)  # holds H_4: completes group 1, but only two fresh members would batch
    fresh.submit_content(batch[5].rollout)
    assert fresh.completes_group(1, range(4, 8))
    fresh.submit_content(batch[6].rollout)  # one fresh member left: nothing to batch
    assert not fresh.completes_group(1, range(4, 8))
    fresh.prefixes.declined[2] = "a prompt shorter than the threshold"  # full passes: batched as full sequences
    assert fresh.completes_group(2, range(8, 12))
    fresh.group_backward = None  # batch_group_members=False, num_iterations > 1, a sharded placement
    assert not fresh.completes_group(2, range(8, 12))


def test_chunk_rows_keeps_each_pass_within_the_token_budget():
    lengths = {0: 10, 1: 30, 2: 12, 3: 11, 4: 50}
    assert chunk_rows([0, 1, 2, 3, 4], lengths, 40) == [[0, 3, 2], [1], [4]]  # 3 × 12 ≤ 40; 30 and 50 alone
    assert chunk_rows([0, 1, 2, 3, 4], lengths, 1000) == [[0, 3, 2, 1, 4]]
    assert chunk_rows([0, 1], lengths, 1) == [[0], [1]]  # a row longer than the budget runs alone


@pytest.mark.parametrize("shared", [True, False], ids=["over_prefix", "full_sequences"])
def test_a_group_past_the_token_budget_runs_as_several_passes(shared):
    """Each pass within the budget: the same update; the members in passes of similar length."""
    batch = _batch()
    _, full = _learner(batch, shared=False, release="reward", beta=0.1, entropy=0.5, temperature=0.7)
    width = 2 * (max(len(s.rollout.completion_ids) for s in batch) + (0 if shared else 10))
    _, totals = _ready_learner(batch, shared=shared, max_tokens=width, beta=0.1, entropy=0.5, temperature=0.7)
    _assert_same_terms(totals, full)
    sizes = [w.batched for w in totals.work if w.kind == "trajectory"]
    assert max(sizes) == 2 and 1 <= min(sizes)  # passes of two rows (at most) per group


def test_thundersync_gathers_members_only_once_every_trajectory_is_delivered():
    """While rollouts run, members are handed over one by one (a padded pass would compete with generation); once
    the last trajectory is delivered, a group's waiting members are gathered."""
    batch = _batch()
    learner = _ready_learner(batch, ready=[], finish=False)
    delivered: list[int] = list(range(len(batch) - 1))
    gather = tail_gather(learner, delivered, len(batch))
    group0 = batch[:G]
    assert gather(list(group0)) == list(group0)
    delivered.append(len(batch) - 1)
    assert gather(list(group0)) == [ReadyMembers(tuple(group0))]
