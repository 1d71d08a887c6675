"""The sampling arithmetic shared by the embedded engine and the embedded server (`rollout/sampling.py`), against a
direct computation of each step: repetition penalty, temperature, top-k, top-p, min-p, the seeded draw, greedy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trl_thundersync.rollout.sampling import Decoder, build_processors, cache_argument, sample_next, sampling_chain
from trl_thundersync.types import SamplingParams

LOGITS = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.5, 1.25, 0.0, -0.75]])  # [1, V], distinct values
SEEN = torch.tensor([[1, 3, 5, 3]])  # prompt + completion so far (token 3 twice: penalized once, like vLLM)


def apply(sampling: SamplingParams, scores: torch.Tensor = LOGITS, seen: torch.Tensor = SEEN) -> torch.Tensor:
    for proc in build_processors(sampling):
        scores = proc(seen, scores)
    return scores


def direct(z: torch.Tensor, seen: list[int], *, penalty=1.0, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The formulas, written out: penalty on seen logits, / T, then each filter keeps a set of tokens."""
    z = z.clone()[0]
    for v in set(seen):
        z[v] = z[v] / penalty if z[v] > 0 else z[v] * penalty
    z = z / temperature
    keep = torch.ones_like(z, dtype=torch.bool)
    if top_k > 0:
        keep &= z >= torch.sort(z, descending=True).values[top_k - 1]
    if top_p < 1.0:
        probs = torch.softmax(z.masked_fill(~keep, -torch.inf), -1)
        order = torch.argsort(probs, descending=True)
        before = torch.cumsum(probs[order], 0) - probs[order]  # mass of the tokens more likely than each
        nucleus = torch.zeros_like(keep)
        nucleus[order] = before < top_p
        keep &= nucleus
    if min_p > 0.0:
        probs = torch.softmax(z.masked_fill(~keep, -torch.inf), -1)
        keep &= probs >= min_p * probs.max()
    return z.masked_fill(~keep, -torch.inf)[None]


@pytest.mark.parametrize("fields", [
    dict(penalty=1.3), dict(temperature=0.7), dict(top_k=3), dict(top_p=0.8), dict(min_p=0.1),
    dict(penalty=1.1, temperature=0.9, top_k=5, top_p=0.9, min_p=0.05),
])
def test_each_processor_is_the_formula(fields):
    sampling = SamplingParams(max_new_tokens=4, temperature=fields.get("temperature", 1.0),
                              top_k=fields.get("top_k", 0), top_p=fields.get("top_p", 1.0),
                              min_p=fields.get("min_p", 0.0), repetition_penalty=fields.get("penalty", 1.0))
    got, expected = apply(sampling), direct(LOGITS, SEEN[0].tolist(), **fields)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))  # the same tokens survive each filter
    torch.testing.assert_close(got[~torch.isinf(got)], expected[~torch.isinf(expected)], rtol=1e-6, atol=0)


def test_filters_keep_the_tokens_worked_out_by_hand():
    # softmax(LOGITS) ≈ [.214, .011, .048, .582, .002, .101, .029, .014]
    kept = lambda s: (~torch.isinf(apply(s, seen=torch.tensor([[0]]))))[0].nonzero().flatten().tolist()  # noqa: E731
    assert kept(SamplingParams(max_new_tokens=1, top_k=2)) == [0, 3]
    assert kept(SamplingParams(max_new_tokens=1, top_p=0.7)) == [0, 3]  # .582 < .7 ≤ .582 + .214
    assert kept(SamplingParams(max_new_tokens=1, min_p=0.15)) == [0, 3, 5]  # p ≥ .15 · .582 = .087


class FixedLogits:
    """A stand-in causal LM whose last-position logits are fixed; records what it was fed."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits, self.fed = logits, []

    def forward(self, input_ids, use_cache=True, logits_to_keep=0, past_key_values=None):
        self.fed.append((input_ids.tolist(), past_key_values))
        return SimpleNamespace(logits=self.logits[:, None, :])

    __call__ = forward


def test_sample_next_draws_from_the_processed_distribution_with_the_request_generator():
    sampling = SamplingParams(max_new_tokens=4, temperature=0.8, top_k=4, repetition_penalty=1.2)
    processed = direct(LOGITS, SEEN[0].tolist(), penalty=1.2, temperature=0.8, top_k=4)
    model, cache = FixedLogits(LOGITS), object()
    for seed in range(20):
        token, logprobs = sample_next(model, "past_key_values", cache, torch.tensor([[7]]), SEEN[0].tolist(),
                                      build_processors(sampling), torch.Generator().manual_seed(seed))
        expected = int(torch.multinomial(torch.softmax(processed, -1), 1,
                                         generator=torch.Generator().manual_seed(seed)).item())
        assert token == expected and not torch.isinf(processed[0, token])
        torch.testing.assert_close(logprobs, torch.log_softmax(processed, -1)[0], rtol=1e-6, atol=0)
    assert model.fed[0] == ([[7]], cache)  # the step feeds `next_input` with the cache it was given
    greedy, _ = sample_next(model, "past_key_values", cache, torch.tensor([[7]]), [0], build_processors(sampling),
                            None)
    assert greedy == 3  # no generator: argmax


def test_decoder_feeds_back_its_tokens_and_greedy_runs_the_chain_at_temperature_one():
    chain = sampling_chain(SamplingParams(max_new_tokens=4, temperature=0.0, top_k=2))
    assert chain.greedy and [type(p).__name__ for p in chain.processors] == ["TemperatureLogitsWarper",
                                                                             "TopKLogitsWarper"]
    assert chain.processors[0].temperature == 1.0
    model = FixedLogits(LOGITS)
    assert cache_argument(model) == "past_key_values"
    decoder = Decoder((4, 6), seed=0, chain=chain)
    for _ in range(2):
        token, logprobs = decoder.step(model, "past_key_values")
    assert model.fed[0][0] == [[4, 6]] and model.fed[1][0] == [[3]]  # the prompt, then the sampled token
    assert decoder.completion_ids == (3, 3) and decoder.num_new == 2 and decoder.tokens == [4, 6, 3, 3]
    expected = float(torch.log_softmax(direct(LOGITS, [], top_k=2), -1)[0, 3])
    assert decoder.logprobs == pytest.approx([expected, expected], rel=1e-6)
    assert not sampling_chain(SamplingParams(max_new_tokens=1, temperature=0.5)).greedy
