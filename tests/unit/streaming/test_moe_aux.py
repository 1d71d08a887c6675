"""The MoE router auxiliary term (`streaming/moe_aux.py`): why it is deferred, and the deferral itself (no model)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from trl_thundersync.errors import BatchIncompleteError
from trl_thundersync.streaming.learner import GRPOBatchLearner, SourceGradients
from trl_thundersync.streaming.moe_aux import RouterAuxLoss, padded_micro_batch
from trl_thundersync.types import Rollout, ScoredRollout

E, K, LAYERS = 4, 2, 2


def router_logits(n_rows, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n_rows * width, E, generator=g, requires_grad=True) for _ in range(LAYERS))


def test_the_load_balancing_gradient_is_weighted_by_micro_batch_counts_so_it_is_not_separable():
    logits = router_logits(3, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 1, 1, 1, 0]])
    whole = load_balancing_loss_func(logits, E, K, mask)
    grads = torch.autograd.grad(whole, logits)
    # the module docstring's closed form: ∇aux = E/(L·N)² · Σ_e C_e ∇S_e
    flat = mask.reshape(-1).float()
    counts = torch.zeros(E)
    for layer in logits:
        counts += torch.zeros(E).scatter_add_(0, layer.softmax(-1).topk(K, -1).indices.reshape(-1),
                                              flat.repeat_interleave(K))
    n = LAYERS * flat.sum()
    s = sum((layer.softmax(-1) * flat.unsqueeze(-1)).sum(0) for layer in logits)
    closed = torch.autograd.grad(E / n**2 * (counts.detach() * s).sum(), logits)
    for a, b in zip(grads, closed, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # per-sequence terms (each sequence's own counts and token count) give another gradient: the term must wait for
    # the whole micro-batch
    rows = [tuple(layer.view(3, 5, E)[i] for layer in logits) for i in range(3)]
    separate = sum(load_balancing_loss_func(r, E, K, mask[i:i + 1]) for i, r in enumerate(rows)) / 3
    split = torch.autograd.grad(separate, logits)
    assert max(float((a - b).abs().max()) for a, b in zip(grads, split, strict=True)) > 1e-3


def rollout(index, prompt=(5, 6), completion=(7, 8, 9), g=2):
    return Rollout(index=index, group=index // g, policy_version=0, prompt_ids=prompt, completion_ids=completion)


def aux_with_calls(permutation, micro_batches, scale=0.25):
    calls = []

    def chunk_backward(rows, scale):
        calls.append(([r.index for r in rows], scale))
        return torch.full((3,), float(len(calls))), 10.0 * len(calls)

    return RouterAuxLoss(permutation=permutation, micro_batches=micro_batches, scale=scale,
                         chunk_backward=chunk_backward, num_params=3), calls


def test_each_micro_batch_runs_once_when_its_last_member_arrives_in_trls_row_order():
    aux, calls = aux_with_calls([2, 0, 3, 1], micro_batches=2)  # micro-batches [2, 0] and [3, 1]
    assert aux.add(rollout(0)) is None and aux.add(rollout(3)) is None
    assert aux.add(rollout(0)) is None  # a repeat is ignored
    assert aux.add(rollout(2)) == 10 and calls == [([2, 0], 0.25)]
    assert aux.add(rollout(2)) is None
    with pytest.raises(BatchIncompleteError, match=r"micro-batches \[1\]"):
        aux.finish()
    assert aux.add(rollout(1)) == 10 and calls[-1] == ([3, 1], 0.25)
    result = aux.finish()
    assert result.values == (10.0, 20.0) and result.direction.tolist() == [3.0, 3.0, 3.0]
    assert result.loss == pytest.approx(0.25 * 30.0)


def test_padded_micro_batch_has_trls_layout():
    rows = [rollout(0, prompt=(5,), completion=(7, 8, 9)), rollout(1, prompt=(5, 6, 4), completion=(7,))]
    ids, mask, keep = padded_micro_batch(rows, pad_token_id=0, attended=lambda r: [1] * len(r.completion_ids))
    assert keep == 3
    assert ids.tolist() == [[0, 0, 5, 7, 8, 9], [5, 6, 4, 7, 0, 0]]
    assert mask.tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    _, masked, _ = padded_micro_batch(rows, 0, lambda r: [0] * len(r.completion_ids), pad_to_multiple_of=4)
    assert masked.tolist() == [[0, 0, 0, 1, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0, 0]]


def scored(index, reward=1.0):
    return ScoredRollout(rollout(index), (reward,), reward, 0.0)


def make_learner(release, aux):
    def backward(src_or_rollout, bucket):
        return SourceGradients(torch.ones(3), None, 3)

    return GRPOBatchLearner(batch_size=4, num_generations=2, num_params=3, policy_version=0, scale_rewards="group",
                            source_backward=backward, release=release, content_backward=backward, router_aux=aux)


@pytest.mark.parametrize("release", ["reward", "content"])
def test_the_learner_runs_the_router_term_once_a_micro_batch_is_final_and_hands_it_to_the_barrier(release):
    aux, calls = aux_with_calls([0, 1, 2, 3], micro_batches=2)
    learner = make_learner(release, aux)
    for i in (0, 1):
        learner.submit_content(rollout(i))
    assert len(calls) == 1  # content is final: the term needs no reward, whatever the release point of H_i
    for i in (0, 1, 2, 3):
        if i >= 2:
            learner.submit_content(rollout(i))
        learner.submit(scored(i, reward=float(i)))
    assert len(calls) == 2
    totals = learner.finish()
    assert [w.kind for w in totals.work].count("router_aux") == 2
    assert totals.router_aux.values == (10.0, 20.0)
    assert totals.peak_stats_bytes >= 3 * 4  # the term's batch buffer is counted


def test_without_content_events_the_term_runs_at_the_reward_and_without_a_term_totals_carry_none():
    aux, calls = aux_with_calls([3, 2, 1, 0], micro_batches=2)
    learner = make_learner("reward", aux)
    for i in range(4):
        learner.submit(scored(i, reward=float(i)))
    assert calls == [([1, 0], 0.25), ([3, 2], 0.25)]
    learner = make_learner("reward", None)
    for i in range(4):
        learner.submit(scored(i, reward=float(i)))
    assert learner.finish().router_aux is None
