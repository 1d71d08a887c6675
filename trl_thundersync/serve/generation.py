"""The embedded server's generation loop: one scheduler thread, every request decoded on its own.

The arithmetic is the embedded engine's (`rollout/sampling.py`, shared with `rollout/local_worker.py`), so that the
same (θ, prompt, seed) gives the same tokens and log-probs through either path:

- each request has its own KV cache (batch size 1) and its own `torch.Generator` seeded with its seed;
- per token: last-position logits → the processor chain of `sampling.build_processors` (repetition penalty →
  temperature → top-k → top-p → min-p) → `torch.multinomial`; the reported log-prob is the log-softmax of that
  processed distribution at the sampled token (vLLM's `processed_logprobs`). Temperature 0 is greedy (argmax).
- every tick advances each active request by one token (round-robin), admits queued requests while fewer than
  `max_in_flight` are active, and resolves a request's future the moment it ends.
- a request that asks for prompt log-probs gets, before its first token, one more forward over its prompt without a
  cache (`score_prompt`): the raw model distribution at every prompt position, as vLLM computes them (no
  temperature or other processors). It is a separate forward so that the sampled tokens stay those of the engine.

Weight updates never mix versions within a request: `update_weights` stops admitting requests, lets the active ones
finish (they keep the version they started with), swaps the weights in place, bumps the version, and only then
admits the queued requests. LoRA adapters are separate, immutable models (the base with the adapter merged), looked
up by name when a request is admitted; replacing or removing one never touches a request that already uses it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from ..rollout.sampling import Decoder, cache_argument, sampling_chain
from ..types import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to generate (a completion request with n prompts × n samples becomes several)."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams  # max_new_tokens = max_tokens; eos_token_ids = every token id that ends the sequence
    stop_token_ids: frozenset[int]  # ids asked for explicitly (reported as stop_reason); the model's EOS is not
    seed: int
    adapter: str | None = None  # LoRA adapter name; None = the base model
    top_logprobs: int = 0  # alternatives reported per position besides the sampled token
    prompt_logprobs: int | None = None  # None: no prompt log-probs; k: each prompt position with its k top tokens


@dataclass(frozen=True)
class PromptPosition:
    """The log-probs at one prompt position after the first, under the raw model distribution (vLLM's entry)."""

    token: int  # the prompt token at this position
    logprob: float  # its log-prob given the prompt tokens before it
    rank: int  # how many tokens are at least as likely as it (1 = the most likely), as vLLM counts
    top: tuple[tuple[int, float], ...]  # the k most likely tokens with their log-probs, most likely first


@dataclass(frozen=True)
class GenerationOutput:
    token_ids: tuple[int, ...]  # generated tokens, the stop token included
    logprobs: tuple[float, ...]  # processed log-prob of each generated token
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]  # per position: the top alternatives (may be empty)
    finish_reason: str  # "stop" or "length"
    stop_reason: int | None  # the stop token id when it was one of stop_token_ids
    policy_version: int  # version of the base weights that generated it
    started: float  # time.monotonic() at admission
    finished: float
    prompt_logprobs: tuple[PromptPosition, ...] | None = None  # positions 1..T-1 of the prompt, when asked for


class AdapterMissing(KeyError):
    """The adapter a request names is not loaded (any more)."""


class _Decoding(Decoder):
    """State of one request in flight."""

    def __init__(self, request: GenerationRequest, future: Future, model: Any, version: int) -> None:
        super().__init__(request.prompt_ids, request.seed, sampling_chain(request.sampling))
        self.request, self.future, self.model, self.version = request, future, model, version
        self.top: list[tuple[tuple[int, float], ...]] = []
        self.prompt_logprobs: tuple[PromptPosition, ...] | None = None  # filled before the first token, if asked


@torch.inference_mode()
def score_prompt(model: Any, prompt_ids: tuple[int, ...], top: int) -> tuple[PromptPosition, ...]:
    """Log-probs of prompt tokens 1..T-1 given the tokens before each, as vLLM computes prompt log-probs: the FP32
    log-softmax of the raw logits (no temperature or processors), the token's rank = the number of tokens at least
    as likely, and the `top` most likely tokens (clipped to the vocabulary)."""
    if len(prompt_ids) < 2:
        return ()
    logits = model(input_ids=torch.tensor([prompt_ids], dtype=torch.long), use_cache=False).logits[0, :-1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [T-1, V]
    targets = torch.tensor(prompt_ids[1:], dtype=torch.long)[:, None]  # [T-1, 1]
    chosen = logprobs.gather(-1, targets)  # [T-1, 1]
    ranks = (logprobs >= chosen).sum(dim=-1)  # [T-1]
    values, ids = torch.topk(logprobs, min(top, logprobs.shape[-1]), dim=-1)  # [T-1, k]
    return tuple(
        PromptPosition(token=int(t), logprob=float(v), rank=int(r),
                       top=tuple((int(i), float(x)) for i, x in zip(row_ids, row_values, strict=True)))
        for t, v, r, row_ids, row_values in zip(targets[:, 0], chosen[:, 0], ranks, ids, values, strict=True)
    )


class GenerationLoop:
    """Owns the base model and the adapters; one daemon thread decodes every request."""

    def __init__(self, model: Any, *, max_in_flight: int, policy_version: int = 0) -> None:
        self.base = model.eval()
        self.version = policy_version
        self.max_in_flight = max_in_flight
        self.cache_kwarg = cache_argument(model)
        self.weights_lock = threading.RLock()  # held while base weights change (and while copying them)
        self._cond = threading.Condition()
        self._pending: deque[tuple[GenerationRequest, Future]] = deque()
        self._updates: deque[tuple[dict[str, torch.Tensor], int, Future]] = deque()
        self._adapters: dict[str, Any] = {}
        self._active: list[_Decoding] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="thundersync-serve-generation", daemon=True)
        self._thread.start()

    # -- called from HTTP handler threads --------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> Future:
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            if request.adapter is not None and request.adapter not in self._adapters:
                raise AdapterMissing(request.adapter)
            self._pending.append((request, future))
            self._cond.notify()
        return future

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> Future:
        """Queue a swap to `state` (already validated); the future resolves to the number of requests drained."""
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            self._updates.append((state, version, future))
            self._cond.notify()
        return future

    def set_adapter(self, name: str, model: Any | None) -> None:
        """Register (or, with None, remove) an adapter model; requests already running keep the one they use."""
        with self._cond:
            if model is None:
                self._adapters.pop(name, None)
            else:
                self._adapters[name] = model.eval()

    def adapters(self) -> list[str]:
        with self._cond:
            return list(self._adapters)

    def load(self) -> int:
        """Requests queued or decoding."""
        with self._cond:
            return len(self._pending) + len(self._active)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10.0)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    # -- the loop ----------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # never leave HTTP handlers waiting on futures nobody will resolve
            with self._cond:
                self._closed = True
                self._fail_all(RuntimeError(f"the generation loop crashed: {type(exc).__name__}: {exc}"))
            raise

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not (self._pending or self._active or self._updates or self._closed):
                    self._cond.wait()
                if self._closed:
                    self._fail_all(RuntimeError("the server is shutting down"))
                    return
                if self._updates and not self._active:
                    self._apply_update(*self._updates.popleft())
                if not self._updates:  # a waiting update holds back admission until the active requests drain
                    self._admit()
            self._tick()

    def _admit(self) -> None:
        while self._pending and len(self._active) < self.max_in_flight:
            request, future = self._pending.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            model = self.base if request.adapter is None else self._adapters.get(request.adapter)
            if model is None:
                future.set_exception(AdapterMissing(request.adapter))
                continue
            self._active.append(_Decoding(request, future, model, self.version))

    def _apply_update(self, state: dict[str, torch.Tensor], version: int, future: Future) -> None:
        try:
            with self.weights_lock, torch.no_grad():
                params = self.base.state_dict()
                for name, tensor in state.items():
                    params[name].copy_(tensor)
                for name, tensor in state.items():  # tied tensors share storage: both values cannot be served
                    if not torch.equal(params[name], tensor.to(params[name].dtype)):
                        raise ValueError(f"tensor {name!r} could not be loaded as sent (tied to another tensor?)")
            self.version = version
        except Exception as exc:  # the handler answers with the error; the server keeps serving
            future.set_exception(exc)
        else:
            future.set_result(version)

    def _tick(self) -> None:
        still: list[_Decoding] = []
        for state in self._active:
            try:
                finish = self._step(state)
            except Exception as exc:  # a bad request fails alone (e.g. a prompt longer than the model's context)
                state.future.set_exception(exc)
                continue
            if finish is None:
                still.append(state)
            else:
                state.future.set_result(self._output(state, *finish))
        with self._cond:
            self._active = still

    def _step(self, state: _Decoding) -> tuple[str, int | None] | None:
        """Sample one token; (finish_reason, stop_reason) when the request is done, else None."""
        request = state.request
        if request.prompt_logprobs is not None and state.prompt_logprobs is None:
            state.prompt_logprobs = score_prompt(state.model, request.prompt_ids, request.prompt_logprobs)
        token, logprobs = state.step(state.model, self.cache_kwarg)
        if request.top_logprobs > 0:
            values, ids = torch.topk(logprobs, min(request.top_logprobs, logprobs.numel()))
            state.top.append(tuple((int(i), float(v)) for i, v in zip(ids, values, strict=True)))
        if token in request.sampling.eos_token_ids:
            return "stop", token if token in request.stop_token_ids else None
        if state.num_new >= request.sampling.max_new_tokens:
            return "length", None
        return None

    def _output(self, state: _Decoding, finish_reason: str, stop_reason: int | None) -> GenerationOutput:
        return GenerationOutput(
            token_ids=state.completion_ids, logprobs=tuple(state.logprobs),
            top_logprobs=tuple(state.top), finish_reason=finish_reason, stop_reason=stop_reason,
            policy_version=state.version, started=state.started, finished=time.monotonic(),
            prompt_logprobs=state.prompt_logprobs,
        )

    def _fail_all(self, error: Exception) -> None:
        for _, future in self._pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
        for state in self._active:
            if not state.future.done():
                state.future.set_exception(error)
        for _, _, future in self._updates:
            future.set_exception(error)
        self._pending.clear()
        self._active.clear()
        self._updates.clear()
