"""The GRPO learner with shared prefixes (`streaming/prefix_groups.py`): the batch direction equals the full passes'
under reward and content release (with β·KL, the entropy bonus, an unscorable member, several buckets), a member
whose tokens do not extend its group's prompt runs its own full pass, a run-level refusal is logged once, and the
FLOP ledger shows fewer token passes."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from tests.fixtures.prefix_learning import (
    EOS,
    PROMPT,
    TOLERANCE,
    G,
    _assert_same_terms,
    _batch,
    _forward,
    _learner,
    _model,
    _params,
    _rel,
    _terms,
)
from trl_thundersync.streaming import prefix_groups as prefix_module
from trl_thundersync.streaming.coalesce import CoalescedTurns, coalesce_turns
from trl_thundersync.streaming.flops import model_flop_counter
from trl_thundersync.streaming.learner import GRPOBatchLearner
from trl_thundersync.streaming.normalization import LossNormalization
from trl_thundersync.streaming.prefix_groups import PrefixGroups
from trl_thundersync.streaming.shared_prefix import pass_flop_counter
from trl_thundersync.streaming.source import TrajectoryBackward
from trl_thundersync.streaming.turn_grpo import TurnScoreBackward
from trl_thundersync.trace.recorder import learner_events
from trl_thundersync.trainers.grpo.backward import prefix_groups
from trl_thundersync.trainers.placement.replicated import ReplicatedPlacement
from trl_thundersync.types import Rollout, ScoredRollout, TurnEvent


@pytest.mark.parametrize("release", ["reward", "content"])
@pytest.mark.parametrize("options", [dict(), dict(beta=0.1, entropy=0.5, temperature=0.7)], ids=["plain", "kl_ent"])
def test_direction_matches_full_passes(release, options):
    batch = _batch()
    _, full = _learner(batch, shared=False, release=release, **options)
    learner, shared = _learner(batch, shared=True, release=release, **options)
    _assert_same_terms(shared, full)
    kinds = [w.kind for w in shared.work]
    assert kinds.count("prefix_forward") == kinds.count("prefix_backward") == 2
    assert shared.kl_sums == pytest.approx(full.kl_sums, rel=1e-5, abs=1e-6)
    assert shared.entropy_sums == pytest.approx(full.entropy_sums, rel=1e-5)
    assert shared.peak_prefix_bytes > 0 == full.peak_prefix_bytes  # the held prefix graphs are tracked
    assert not learner.prefixes.open and not learner.prefixes.mismatched


def test_mismatched_member_runs_its_own_full_pass():
    batch = _batch(rewrite=6)  # group 1's third member carries another prompt
    _, full = _learner(batch, shared=False, release="reward")
    learner, shared = _learner(batch, shared=True, release="reward")
    assert list(learner.prefixes.mismatched) == [6]
    for key, vector in _terms(full).items():
        assert _rel(_terms(shared)[key], vector) <= TOLERANCE, key
    items = {w.index: w for w in shared.work if w.kind == "trajectory"}
    assert items[6].flops is None and items[5].flops is not None  # priced as a full pass by the trace


def test_cap_declines_groups_beyond_max_open(caplog):
    batch = _batch()
    _, full = _learner(batch, shared=False, release="content", max_open=1)
    with caplog.at_level(logging.INFO, logger=prefix_module.__name__):
        learner, shared = _learner(batch, shared=True, release="content", max_open=1)
    assert list(learner.prefixes.declined) == [1]
    assert sum("group 1 runs full passes" in r.getMessage() for r in caplog.records) == 1
    for key, vector in _terms(full).items():
        assert _rel(_terms(shared)[key], vector) <= TOLERANCE, key


@pytest.mark.parametrize("release", ["reward", "content"])
def test_prompts_shorter_than_the_threshold_run_full_passes(release, caplog):
    batch = _batch(prompts=(PROMPT - 3, PROMPT))  # group 0's prompt is below the threshold, group 1's at it
    _, full = _learner(batch, shared=False, release=release)
    with caplog.at_level(logging.INFO, logger=prefix_module.__name__):
        learner, shared = _learner(batch, shared=True, release=release, min_prompt_tokens=PROMPT)
    assert learner.prefixes.declined == {0: f"its prompt of {PROMPT - 3} tokens is shorter than "
                                            f"shared_prefix_min_prompt_tokens={PROMPT}"}
    assert sum("group 0 runs full passes: its prompt of 7 tokens" in r.getMessage() for r in caplog.records) == 1
    kinds = [w.kind for w in shared.work]
    assert kinds.count("prefix_forward") == kinds.count("prefix_backward") == 1  # group 1's prompt only
    # the members' passes carry their own FLOPs only over a prefix (a full pass is priced by the trace)
    passes = {"reward": "trajectory", "content": "content"}[release]
    priced = {w.index: w.flops is not None for w in shared.work if w.kind == passes}
    assert not any(priced[i] for i in range(G)) and all(priced[i] for i in range(G, 2 * G))
    for key, vector in _terms(full).items():
        assert _rel(_terms(shared)[key], vector) <= TOLERANCE, key


def test_run_level_refusal_is_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(prefix_module, "_LOGGED", set())
    args = SimpleNamespace(shared_prefix=True, num_iterations=1, off_policy_mask_threshold=None, temperature=1.0)
    args.num_iterations = 2
    settings = SimpleNamespace(args=args, release="turn", objective_weights=None)
    models = SimpleNamespace(module=_model(1.0, 3), params=_params())
    with caplog.at_level(logging.WARNING, logger=prefix_module.__name__):
        for _ in range(3):
            assert prefix_groups(settings, models, 2, placement=None) is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "sharded" in messages[0]  # (placement=None: not the replicated placement)
    args.shared_prefix = False  # off: nothing to refuse, nothing logged
    assert prefix_groups(settings, models, 2, placement=None) is None
    assert len(caplog.records) == 1


def test_the_threshold_reaches_the_batch_prefixes():
    args = SimpleNamespace(shared_prefix=True, num_iterations=1, off_policy_mask_threshold=None, temperature=1.0,
                           shared_prefix_min_prompt_tokens=300)
    settings = SimpleNamespace(args=args, release="content", objective_weights=None, beta=0.0, num_generations=G,
                               device=torch.device("cpu"))
    models = SimpleNamespace(module=_model(1.0, 3), params=_params(), reference=None)
    placement = ReplicatedPlacement(SimpleNamespace(num_processes=1))
    assert prefix_groups(settings, models, 2, placement=placement).min_prompt_tokens == 300


def test_flop_ledger_counts_fewer_token_passes():
    batch = _batch()
    _, full = _learner(batch, shared=False, release="reward")
    _, shared = _learner(batch, shared=True, release="reward")
    context = {s.rollout.index: len(s.rollout.prompt_ids) + len(s.rollout.completion_ids) for s in batch}
    flops_of = model_flop_counter(_model(1.0, 3), _params())
    full_flops = sum(e.flops for e in learner_events(full.work, context, flops_of))
    shared_flops = sum(e.flops for e in learner_events(shared.work, context, flops_of))
    assert {e.kind for e in learner_events(shared.work, context, flops_of)} >= {"prefix_forward", "prefix_backward"}
    # 2 groups × G members: the prompt's PROMPT tokens are passed 2 times instead of 2·G times (the unscorable
    # member runs no score pass; the full path's whole-context price counts it anyway)
    prompt_passes = sum(len(s.rollout.prompt_ids) for s in batch)
    assert math.isfinite(shared_flops) and 0 < shared_flops < full_flops
    assert shared_flops < full_flops * (1 - 0.5 * (prompt_passes - 2 * PROMPT) / sum(context.values()))


# -- turn release: each member's first turn starts from its group's prefix -------------------------------------------
def _turn_batch(groups: int = 2, rewrite: int | None = None):
    """`_batch`-like groups whose completions are two turns: action 0, two observation tokens, action 1 (EOS last);
    member `rewrite`'s first turn sees another first prompt token than its group's prefix."""
    gen = torch.Generator().manual_seed(1)
    vocab = _model(1.0, 3).config.vocab_size
    batch, events = [], []
    for g in range(groups):
        prompt = tuple(torch.randint(8, vocab, (PROMPT,), generator=gen).tolist())
        for m in range(G):
            index = g * G + m
            first = (prompt[0] + 1 - 8) % (vocab - 8) + 8 if index == rewrite else prompt[0]
            context = (first, *prompt[1:])
            action0 = tuple(torch.randint(8, vocab, (2 + m,), generator=gen).tolist())
            framing = tuple(torch.randint(8, vocab, (2,), generator=gen).tolist())
            action1 = (*torch.randint(8, vocab, (3,), generator=gen).tolist(), EOS)
            events += [TurnEvent(index, 0, 0, context, action0, 0.0),
                       TurnEvent(index, 1, 0, context + action0 + framing, action1, 0.0)]
            completion = action0 + framing + action1
            mask = (1,) * len(action0) + (0, 0) + (1,) * len(action1)
            rollout = Rollout(index=index, group=g, policy_version=0, prompt_ids=context, completion_ids=completion,
                              env_mask=mask)
            reward = float("nan") if index == 1 else float(torch.rand((), generator=gen))
            batch.append(ScoredRollout(rollout, (reward,), reward, 0.0))
    return batch, events


def _turn_learner(batch, events, *, shared: bool, beta: float = 0.0, entropy: float | None = None,
                  temperature: float = 1.0, coalesce: bool = False):
    model, params = _model(temperature, 3), _params(temperature)
    norm = LossNormalization("grpo", batch_size=len(batch), micro_batches=2, max_completion_length=64)
    prefixes = None
    if shared:
        prefixes = PrefixGroups(model=model, params=params, group_size=G, max_open=len(batch) // G,
                                temperature=temperature, reference=_model(temperature, 4) if beta else None,
                                flops=pass_flop_counter(model, params))
    backward = TrajectoryBackward(
        params=params, logps_fn=_forward(False, temperature), normalization=norm, eos_and_pad=(EOS, 0),
        mask_truncated=False, beta=beta, ref_logps_fn=_forward(False, temperature, 4) if beta else None,
        logps_entropy_fn=_forward(True, temperature) if entropy is not None else None, entropy_coef=entropy,
        prefixes=prefixes, temperature=temperature)
    turns = TurnScoreBackward(model=model, params=params, normalization=norm, eos_and_pad=(EOS, 0),
                              mask_truncated=False, temperature=temperature, beta=beta,
                              ref_model=_model(temperature, 4) if beta else None, policy_version=0,
                              entropy_coef=entropy, prefixes=prefixes)
    learner = GRPOBatchLearner(
        batch_size=len(batch), num_generations=G, num_params=sum(p.numel() for p in params), policy_version=0,
        scale_rewards="group", source_backward=backward, bucket_of=lambda i: i % 2, release="turn",
        content_backward=backward.content, turn_source=turns, prefixes=prefixes,
        entropy_micro_batch_of=(lambda i: i % 2) if entropy is not None else None)
    for item in coalesce_turns(events) if coalesce else events:  # (events: each trajectory's turns in a row)
        if isinstance(item, CoalescedTurns):
            learner.submit_turns(item.events)
        else:
            learner.submit_turn(item)
    for source in batch:
        learner.submit_content(source.rollout)
    for source in reversed(batch):
        learner.submit(source)
    return learner, learner.finish()


@pytest.mark.parametrize("coalesce", [False, True], ids=["per_turn", "coalesced"])
@pytest.mark.parametrize("options", [dict(), dict(beta=0.1, entropy=0.5, temperature=0.7)], ids=["plain", "kl_ent"])
def test_turn_release_over_the_group_prefix_matches_full_passes(options, coalesce):
    batch, events = _turn_batch()
    _, full = _learner(batch, shared=False, release="reward", **options)  # whole-trajectory passes, no prefix
    learner, turned = _turn_learner(batch, events, shared=True, coalesce=coalesce, **options)
    assert turned.turn_fallbacks == 0 and not learner.prefixes.mismatched
    _assert_same_terms(turned, full)
    kinds = [w.kind for w in turned.work]
    assert kinds.count("prefix_forward") == kinds.count("prefix_backward") == 2
    assert kinds.count("turn") == (1 if coalesce else 2) * len(batch) and kinds.count("close") == len(batch)
    assert sum(w.turns for w in turned.work if w.kind == "turn") == 2 * len(batch)
    # every member's turns started from the prefix: turn 0 forwarded its action only, never the prompt again
    assert all(not state.open for state in (learner.turn_source, learner.turn_source.core))
    assert turned.kl_sums == pytest.approx(full.kl_sums, rel=1e-5, abs=1e-6)
    assert turned.entropy_sums == pytest.approx(full.entropy_sums, rel=1e-5)


def test_turn_release_member_with_another_prompt_runs_its_own_history():
    batch, events = _turn_batch(rewrite=6)
    _, full = _learner(batch, shared=False, release="reward")
    learner, turned = _turn_learner(batch, events, shared=True)
    assert list(learner.prefixes.mismatched) == [6]
    for key, vector in _terms(full).items():
        assert _rel(_terms(turned)[key], vector) <= TOLERANCE, key


def test_turn_release_prefix_forwards_the_prompt_once_per_group(monkeypatch):
    batch, events = _turn_batch()
    forwarded: list[int] = []
    original = TurnScoreBackward.turn
    monkeypatch.setattr(TurnScoreBackward, "turn", lambda self, event: forwarded.append(original(self, event)))
    tokens = {}
    for shared in (False, True):
        forwarded.clear()
        _, totals = _turn_learner(batch, events, shared=shared)
        prefix = sum(w.tokens for w in totals.work if w.kind == "prefix_forward")
        tokens[shared] = (sum(forwarded), prefix)
    # without the prefix every member's first turn forwards the prompt; with it, each group forwards it once
    assert tokens[False] == (tokens[True][0] + len(batch) * PROMPT, 0)
    assert tokens[True][1] == 2 * PROMPT


@pytest.mark.parametrize("release", ["reward", "content"])
def test_learner_items_do_not_overlap(release):
    """One learner thread: its items' intervals are disjoint, so busy time (their sum) counts each pass once (a
    group's fold and its prefix backward are two items, not one inside the other)."""
    _, totals = _learner(_batch(), shared=True, release=release)
    items = sorted(totals.work, key=lambda w: w.start)
    assert {"group_fold", "prefix_backward"} <= {w.kind for w in items}
    for before, after in zip(items, items[1:], strict=False):
        assert after.start >= before.end, (before.kind, after.kind)
