"""`head_logps` rounds as TRL's fused LM head does (its torch path), so prefix-path log-probs are the full pass's."""

from __future__ import annotations

import pytest
import torch
from trl.kernels import ChunkedLogProbFunction

from trl_thundersync.streaming.head_logps import VOCAB_TILE, head_logps


def trl_head(hidden, weight, actions, temperature):
    """TRL's own fused head (`add_fused_lm_head`'s kernel) on hidden states: (log-probs, entropies)."""
    logps, entropies, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, actions, temperature, VOCAB_TILE,
                                                        None, 1.0, ("log_probs", "entropy"))
    return logps, entropies


@pytest.mark.parametrize(("vocab", "temperature"), [(997, 1.0), (997, 0.7), (VOCAB_TILE + 301, 1.0)])
def test_bitwise_trl_fused_head_on_the_same_logits(vocab, temperature):
    gen = torch.Generator().manual_seed(vocab)
    hidden, weight = torch.randn(24, 16, generator=gen) * 3, torch.randn(vocab, 16, generator=gen)
    actions = torch.randint(0, vocab, (24,), generator=gen)
    actions[0] = vocab - 1  # a target in the last tile
    ref_logps, ref_entropies = trl_head(hidden, weight, actions, temperature)
    logits = torch.mm(hidden, weight.t())  # the tile product TRL runs (one tile, or the same split below)
    if vocab > VOCAB_TILE:
        logits = torch.cat([torch.mm(hidden, weight[s : s + VOCAB_TILE].t()) for s in range(0, vocab, VOCAB_TILE)],
                           dim=-1)
    logps, entropies = head_logps(logits, actions, temperature, entropy=True)
    assert torch.equal(logps, ref_logps)
    assert torch.equal(entropies, ref_entropies)
    # log_softmax gives the same numbers up to rounding, but not these bits: what made the logged values differ
    naive = torch.log_softmax(logits / temperature, -1).gather(-1, actions[:, None])[:, 0]
    torch.testing.assert_close(naive, ref_logps)
    assert not torch.equal(naive, ref_logps)


def test_gradients_are_trls():
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(10, 8, generator=gen), torch.randn(301, 8, generator=gen)
    actions = torch.randint(0, 301, (10,), generator=gen)
    seeds = torch.randn(2, 10, generator=gen)

    def grad(fn):
        h = hidden.clone().requires_grad_(True)
        logps, entropies = fn(h)
        ((logps * seeds[0]).sum() + (entropies * seeds[1]).sum()).backward()
        return h.grad

    ours = grad(lambda h: head_logps(h @ weight.t(), actions, 0.8, entropy=True))
    theirs = grad(lambda h: trl_head(h, weight, actions, 0.8))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_entropy_only_when_asked():
    logps, entropies = head_logps(torch.zeros(3, 5), torch.tensor([0, 1, 4]))
    assert entropies is None
    torch.testing.assert_close(logps, torch.full((3,), -torch.log(torch.tensor(5.0)).item()))
