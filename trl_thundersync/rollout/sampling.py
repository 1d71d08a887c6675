"""The sampling arithmetic of both local decoders: the embedded engine's worker (`rollout/local_worker.py`) and the
embedded server's generation loop (`serve/generation.py`) decode through this module, so the same (θ, prompt, seed)
gives the same tokens and log-probs bit for bit through either path.

Per token (vLLM's order of operations, with `transformers`' logits processors):

    logits z [V] at the last position (FP32)
      → repetition penalty ρ over prompt + completion so far: z_v / ρ if z_v > 0 else z_v · ρ (seen tokens only)
      → temperature T: z / T
      → top-k: every logit below the k-th largest → -inf
      → top-p: the smallest set of most likely tokens whose probability reaches p is kept, the rest → -inf
      → min-p: tokens with probability below min_p · max probability → -inf
      → token ~ softmax(z) with the request's own `torch.Generator` (argmax when greedy: temperature 0)

The reported log-prob is log_softmax(z)[token] of that processed distribution (vLLM's `processed_logprobs`); with
top-k/p/min-p off it is the temperature-scaled log-prob. Temperature 0 (greedy, embedded server only) runs the chain
at temperature 1 and takes the argmax, so its log-probs are those of the untempered distribution.

Each sequence decodes on its own (batch size 1) with its own KV cache (`Decoder`), so neither its tokens nor its
log-probs depend on what else is in flight.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..types import SamplingParams


@dataclass(frozen=True)
class SamplingChain:
    """How one request's next token is drawn from the last-position logits."""

    processors: tuple[Any, ...]  # `transformers` logits processors, applied in this order to [1, V] scores
    greedy: bool  # True: argmax of the processed scores (temperature 0); False: multinomial with the request's seed


def build_processors(sampling: SamplingParams) -> list[Any]:
    """The processor chain for `sampling` (temperature > 0): repetition penalty → temperature → top-k → top-p →
    min-p, each present only when it changes the scores."""
    from transformers.generation import logits_process as lp

    procs: list[Any] = []
    if sampling.repetition_penalty != 1.0:
        procs.append(lp.RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty))
    procs.append(lp.TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k > 0:
        procs.append(lp.TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        procs.append(lp.TopPLogitsWarper(sampling.top_p))
    if sampling.min_p > 0.0:
        procs.append(lp.MinPLogitsWarper(sampling.min_p))
    return procs


def sampling_chain(sampling: SamplingParams) -> SamplingChain:
    """The chain for `sampling`; temperature 0 means greedy (the chain then runs at temperature 1)."""
    greedy = sampling.temperature == 0.0
    if greedy:
        sampling = dataclasses.replace(sampling, temperature=1.0)
    return SamplingChain(processors=tuple(build_processors(sampling)), greedy=greedy)


def cache_argument(model: Any) -> str:
    """The keyword this model's forward takes its KV cache under (transformers renamed `past_key_values` to `cache`)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.inference_mode()
def sample_next(model: Any, cache_kwarg: str, cache: Any, next_input: torch.Tensor, tokens: list[int],
                processors: Sequence[Any], generator: torch.Generator | None) -> tuple[int, torch.Tensor]:
    """One decoding step.

    `next_input` [1, T] is fed with `cache`; `tokens` (prompt + completion so far) feed the repetition penalty.
    Returns the sampled token (argmax when `generator` is None: greedy) and the log-softmax of the processed
    scores [V], whose entry at the token is the reported (vLLM "processed") log-prob.
    """
    out = model(input_ids=next_input, use_cache=True, logits_to_keep=1, **{cache_kwarg: cache})
    scores = out.logits[:, -1, :].float()  # [1, V]
    seen = torch.tensor([tokens], dtype=torch.long)
    for proc in processors:
        scores = proc(seen, scores)
    if generator is None:
        token = int(torch.argmax(scores, dim=-1).item())
    else:
        token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).item())
    return token, torch.log_softmax(scores, dim=-1)[0]


class Decoder:
    """The decoding state of one sequence: its KV cache, its generator (seeded with the request's seed), the tokens
    so far and the log-prob of each sampled token. `step` advances it by one token."""

    def __init__(self, prompt_ids: Sequence[int], seed: int, chain: SamplingChain) -> None:
        from transformers import DynamicCache

        self.prompt_length = len(prompt_ids)
        self.chain = chain
        self.cache = DynamicCache()
        self.generator = torch.Generator().manual_seed(seed)
        self.tokens = list(prompt_ids)  # prompt + completion, for the repetition penalty
        self.next_input = torch.tensor([list(prompt_ids)], dtype=torch.long)  # [1, T]: the prompt, then one token
        self.logprobs: list[float] = []  # processed log-prob of each sampled token
        self.started = time.monotonic()

    def step(self, model: Any, cache_kwarg: str) -> tuple[int, torch.Tensor]:
        """Sample one token; returns it and the processed log-probs [V] it was drawn from."""
        token, logprobs = sample_next(model, cache_kwarg, self.cache, self.next_input, self.tokens,
                                      self.chain.processors, None if self.chain.greedy else self.generator)
        self.logprobs.append(float(logprobs[token]))
        self.tokens.append(token)
        self.next_input = torch.tensor([[token]], dtype=torch.long)
        return token, logprobs

    @property
    def completion_ids(self) -> tuple[int, ...]:
        return tuple(self.tokens[self.prompt_length:])

    @property
    def num_new(self) -> int:
        """Tokens sampled so far."""
        return len(self.tokens) - self.prompt_length
