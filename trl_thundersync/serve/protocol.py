"""Request validation and response bodies of the embedded server, in vLLM's shapes (see `rollout/vllm_api.py`).

`POST /v1/completions` accepts vLLM's token-id prompts (`[int, ...]` or `[[int, ...], ...]`; text prompts when the
model folder has a tokenizer) and the sampling fields the embedded generation loop implements: `max_tokens`, `n`,
`temperature` (0 = greedy), `top_p`, `top_k` (0 or -1 = off), `min_p`, `repetition_penalty`, `seed`, `logprobs`,
`stop_token_ids`, `ignore_eos`, `skip_special_tokens`, `return_token_ids`, `return_tokens_as_token_ids`,
`prompt_logprobs`. Every other field of vLLM's `CompletionRequest` (0.22 … 0.31, `tests/data/vllm_contract.json`)
is either `IGNORED` (it leaves the samples as they are: `user`, `priority`, `cache_salt`, ...) or `REFUSED`: set to
anything but its "off" value (streaming, presence/frequency penalties, stop strings, logit bias, structured outputs,
prompt truncation, ...) it is answered HTTP 400 naming it, never ignored; `tests/unit/rollout/test_vllm_contract.py`
checks that the three lists cover the contract. Fields vLLM does not know are ignored, as vLLM's `OpenAIBaseModel`
(`extra="allow"`) ignores them. As in vLLM, sample j of a request with `n > 1` uses seed `seed + j`.

`prompt_logprobs: k` (vLLM's field; 0 = the prompt tokens only, -1 = the whole vocabulary) answers, per choice,
`prompt_logprobs`: one entry per prompt token, the first `null`, then `{token_id: {"logprob", "rank",
"decoded_token"}}` holding the prompt token (rank = how many tokens are at least as likely) and the k most likely
tokens (ranks 1..k); -inf is sent as -9999.0. As vLLM does, a value below -1 and a value over the server's
`max_logprobs` (vLLM's `--max-logprobs`; -1 = the vocabulary) are refused with HTTP 400; the same limit holds for
`logprobs`.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ..types import SamplingParams
from .generation import GenerationOutput, GenerationRequest

_LOGPROB_FLOOR = -9999.0  # vLLM clamps reported log-probs to this value (JSON has no -inf)
# vLLM `CompletionRequest` fields the generation loop implements.
IMPLEMENTED = frozenset({"model", "prompt", "max_tokens", "n", "temperature", "top_p", "top_k", "min_p",
                         "repetition_penalty", "seed", "logprobs", "stop_token_ids", "ignore_eos",
                         "skip_special_tokens", "return_token_ids", "return_tokens_as_token_ids", "prompt_logprobs",
                         "add_special_tokens"})
# Fields that leave the samples and the answer's fields we fill as they are (routing, caching, text-only, beam-only,
# streaming-only options); accepted and ignored.
IGNORED = frozenset({"user", "priority", "cache_salt", "request_id", "kv_transfer_params", "ec_transfer_params",
                     "spaces_between_special_tokens", "session_id", "routed_experts_prompt_start", "stream_options",
                     "stream_interval", "length_penalty", "truncation_side", "watermarking"})
# Fields that change the samples or the answer but are not implemented here: name -> the value that means "off".
REFUSED: dict[str, Any] = {
    "stream": False, "echo": False, "use_beam_search": False, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "stop": None, "min_tokens": 0, "logit_bias": None, "allowed_token_ids": None, "bad_words": None,
    "structured_outputs": None, "response_format": None, "suffix": None, "logprob_token_ids": None,
    "include_stop_str_in_output": False, "truncate_prompt_tokens": None, "thinking_token_budget": None,
    "repetition_detection": None, "vllm_xargs": None, "prompt_embeds": None, "return_token_offsets": False,
}


class APIError(Exception):
    """An error answer: HTTP status plus vLLM's error body."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class ServedModel:
    """What request validation needs to know about the base model."""

    name: str  # served model name (vLLM: --served-model-name, default the model path)
    vocab_size: int
    max_model_len: int
    eos_token_ids: frozenset[int]  # the model's own EOS ids (generation config), ignored with ignore_eos
    max_logprobs: int = -1  # vLLM's --max-logprobs: most log-probs per position a request may ask for; -1 = vocab


@dataclass(frozen=True)
class CompletionCall:
    """A validated completion request."""

    model: str  # echoed in the response: the base name or the adapter name
    prompts: tuple[tuple[int, ...], ...]
    n: int
    requests: tuple[GenerationRequest, ...]  # prompt-major: prompt i, sample j at i * n + j
    logprobs: int | None  # None: no log-probs in the answer
    prompt_logprobs: int | None  # None: no prompt log-probs in the answer; else the top tokens listed per position
    return_token_ids: bool
    tokens_as_ids: bool
    skip_special_tokens: bool


def _field(body: dict, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and kind is not bool:
        raise APIError(400, f"`{name}` must be a number, got {value!r}", param=name)
    if not isinstance(value, kind):
        raise APIError(400, f"`{name}` has the wrong type: {value!r}", param=name)
    return value


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise APIError(400, f"`{name}` {message}", param=name)


def _prompts(body: dict, served: ServedModel,
             tokenize: Callable[[str, bool], list[int]] | None) -> list[tuple[int, ...]]:
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt)):
        if tokenize is None:
            raise APIError(400, "text prompts need a tokenizer in the model folder; send token ids", param="prompt")
        add_special = bool(body.get("add_special_tokens", True))
        texts = [prompt] if isinstance(prompt, str) else prompt
        prompts = [tuple(tokenize(text, add_special)) for text in texts]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts = [tuple(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = [tuple(p) for p in prompt]
    else:
        raise APIError(400, "`prompt` must be token ids, a list of token-id lists, or text", param="prompt")
    for ids in prompts:
        _check(len(ids) > 0, "prompt", "must not be empty")
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < served.vocab_size]
        _check(not bad, "prompt", f"holds token id {bad[:1]} outside the vocabulary [0, {served.vocab_size})")
    return prompts


def parse_completion_request(body: Any, served: ServedModel, adapters: Collection[str],
                             tokenize: Callable[[str, bool], list[int]] | None = None) -> CompletionCall:
    """Validate a `/v1/completions` body; raises `APIError` (400, or 404 for an unknown model)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name, off in REFUSED.items():
        if body.get(name) not in (None, off) and body.get(name) != [] and body.get(name) != {}:
            raise APIError(400, f"`{name}` is not supported by the embedded server", param=name)
    model = body.get("model") or served.name
    if model != served.name and model not in adapters:
        raise APIError(404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model")
    prompts = _prompts(body, served, tokenize)
    sampling, stop = _sampling(body, served, max(len(p) for p in prompts))
    n = _field(body, "n", int, 1)
    _check(n >= 1, "n", "must be >= 1")
    logprobs, prompt_logprobs = _logprob_counts(body, served)
    seed = _field(body, "seed", int, None)
    seed = random.getrandbits(63) if seed is None else seed
    top = 0 if logprobs is None else (served.vocab_size if logprobs == -1 else logprobs)
    prompt_top = None if prompt_logprobs is None else (served.vocab_size if prompt_logprobs == -1 else prompt_logprobs)
    requests = tuple(  # the prompt is scored once, by its first sample; every choice of the prompt reports it
        GenerationRequest(prompt_ids=p, sampling=sampling, stop_token_ids=stop, seed=seed + j,
                          adapter=None if model == served.name else model, top_logprobs=top,
                          prompt_logprobs=prompt_top if j == 0 else None)
        for p in prompts for j in range(n)
    )
    return CompletionCall(model=model, prompts=tuple(prompts), n=n, requests=requests, logprobs=logprobs,
                          prompt_logprobs=prompt_logprobs,
                          return_token_ids=bool(body.get("return_token_ids")),
                          tokens_as_ids=bool(body.get("return_tokens_as_token_ids")),
                          skip_special_tokens=bool(body.get("skip_special_tokens", True)))


def _sampling(body: dict, served: ServedModel, longest: int) -> tuple[SamplingParams, frozenset[int]]:
    """The sampling fields (validated) and the explicitly asked stop token ids; `longest` = the longest prompt."""
    max_tokens = _field(body, "max_tokens", int, 16)
    temperature = float(_field(body, "temperature", (int, float), 1.0))
    top_p = float(_field(body, "top_p", (int, float), 1.0))
    top_k = _field(body, "top_k", int, 0)
    min_p = float(_field(body, "min_p", (int, float), 0.0))
    repetition_penalty = float(_field(body, "repetition_penalty", (int, float), 1.0))
    stop_ids = _field(body, "stop_token_ids", list, [])
    _check(max_tokens >= 1, "max_tokens", "must be >= 1")
    _check(temperature >= 0.0, "temperature", "must be >= 0")
    _check(0.0 < top_p <= 1.0, "top_p", "must be in (0, 1]")
    _check(top_k >= -1, "top_k", "must be -1, 0 (off) or positive")
    _check(0.0 <= min_p <= 1.0, "min_p", "must be in [0, 1]")
    _check(repetition_penalty > 0.0, "repetition_penalty", "must be > 0")
    _check(all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids), "stop_token_ids", "must be ints")
    if longest + max_tokens > served.max_model_len:
        raise APIError(400, f"This model's maximum context length is {served.max_model_len} tokens. However, you "
                            f"requested {longest + max_tokens} tokens ({longest} in the messages, {max_tokens} in "
                            "the completion).", param="max_tokens")
    stop = frozenset(int(t) for t in stop_ids)
    ends = stop if body.get("ignore_eos") else stop | served.eos_token_ids
    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
                              top_k=max(top_k, 0), min_p=min_p, repetition_penalty=repetition_penalty,
                              eos_token_ids=tuple(sorted(ends)))
    return sampling, stop


def _logprob_counts(body: dict, served: ServedModel) -> tuple[int | None, int | None]:
    """`logprobs` and `prompt_logprobs` as asked (None: not asked), refused as vLLM refuses them."""
    logprobs = _field(body, "logprobs", int, None)
    _check(logprobs is None or logprobs >= -1, "logprobs", "must be >= 0, or -1 for the whole vocabulary")
    prompt_logprobs = _field(body, "prompt_logprobs", int, None)
    if prompt_logprobs is not None and prompt_logprobs < -1:  # vLLM's message (CompletionRequest.check_logprobs)
        raise APIError(400, "`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs")
    _check_max_logprobs(logprobs, "logprobs", "sample", served)
    _check_max_logprobs(prompt_logprobs, "prompt_logprobs", "prompt", served)
    return logprobs, prompt_logprobs


def _check_max_logprobs(value: int | None, name: str, kind: str, served: ServedModel) -> None:
    """vLLM's limit (`SamplingParams._validate_logprobs`): -1 asks for the vocabulary; more than the server's
    `max_logprobs` (-1: the vocabulary) is a 400."""
    if not value:
        return
    limit = served.vocab_size if served.max_logprobs == -1 else served.max_logprobs
    asked = served.vocab_size if value == -1 else value
    if asked > limit:
        raise APIError(400, f"Requested {kind} logprobs of {asked}, which is greater than max allowed: {limit}",
                       param=name)


def _logprobs_body(output: GenerationOutput, spell: Callable[[int], str]) -> dict[str, Any]:
    tokens = [spell(t) for t in output.token_ids]
    offsets, position = [], 0
    for text in tokens:
        offsets.append(position)
        position += len(text)
    top = []
    for token, value, alternatives in zip(output.token_ids, output.logprobs, output.top_logprobs or
                                          [()] * len(output.token_ids), strict=True):
        entry = {spell(t): max(v, _LOGPROB_FLOOR) for t, v in alternatives}
        entry[spell(token)] = max(value, _LOGPROB_FLOOR)  # the sampled token is always listed
        top.append(entry)
    return {"text_offset": offsets, "token_logprobs": [max(v, _LOGPROB_FLOOR) for v in output.logprobs],
            "tokens": tokens, "top_logprobs": top}


def _prompt_logprobs_body(output: GenerationOutput,
                          token_text: Callable[[int], str | None]) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` list: None for the first prompt token, then per position the prompt token (its own
    rank) and the top tokens (ranks 1..k; a prompt token among them takes its top-k rank, as in vLLM's dict)."""
    if output.prompt_logprobs is None:
        raise ValueError("prompt log-probs were asked for but the generation loop returned none")

    def entry(token: int, value: float, rank: int) -> dict[str, Any]:
        return {"logprob": _LOGPROB_FLOOR if value == -math.inf else value, "rank": rank,
                "decoded_token": token_text(token)}

    body: list[dict[str, dict[str, Any]] | None] = [None]
    for position in output.prompt_logprobs:
        scored = {str(position.token): entry(position.token, position.logprob, position.rank)}
        for rank, (token, value) in enumerate(position.top, start=1):
            scored[str(token)] = entry(token, value, rank)
        body.append(scored)
    return body


def completion_response(call: CompletionCall, outputs: Sequence[GenerationOutput],
                        decode: Callable[[Sequence[int], bool], str] | None,
                        token_text: Callable[[int], str | None] | None = None) -> dict[str, Any]:
    """vLLM's `CompletionResponse` for the outputs of `call.requests` (same order). `token_text` spells a token as
    `prompt_logprobs`' `decoded_token` (vLLM: the tokenizer's token string; None without a tokenizer)."""

    def spell(token: int) -> str:
        return f"token_id:{token}" if call.tokens_as_ids or decode is None else decode([token], False)

    choices = []
    spell_prompt = token_text or (lambda _: None)
    for index, output in enumerate(outputs):
        prompt = call.prompts[index // call.n]
        first = outputs[index // call.n * call.n]  # the prompt's first sample carries its prompt log-probs
        choices.append({
            "index": index,
            "text": decode(output.token_ids, call.skip_special_tokens) if decode is not None else "",
            "logprobs": None if call.logprobs is None else _logprobs_body(output, spell),
            "finish_reason": output.finish_reason,
            "stop_reason": output.stop_reason,
            "token_ids": list(output.token_ids) if call.return_token_ids else None,
            "prompt_logprobs": None if call.prompt_logprobs is None else _prompt_logprobs_body(first, spell_prompt),
            "prompt_token_ids": list(prompt) if call.return_token_ids else None,
        })
    prompt_tokens = sum(len(p) for p in call.prompts)
    completion_tokens = sum(len(o.token_ids) for o in outputs)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
        "model": call.model, "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                  "completion_tokens": completion_tokens, "prompt_tokens_details": None},
        "system_fingerprint": None,
    }


def models_response(served: ServedModel, root: str, adapters: dict[str, str]) -> dict[str, Any]:
    """vLLM's `ModelList`: the base model, then every loaded adapter (`root` = its path, `parent` = the base)."""
    created = int(time.time())
    base = {"id": served.name, "object": "model", "created": created, "owned_by": "thundersync", "root": root,
            "parent": None, "max_model_len": served.max_model_len, "permission": []}
    cards = [{"id": name, "object": "model", "created": created, "owned_by": "thundersync", "root": path,
              "parent": served.name, "max_model_len": None, "permission": []} for name, path in adapters.items()]
    return {"object": "list", "data": [base, *cards]}


def server_info_response(served: ServedModel, max_num_seqs: int) -> dict[str, Any]:
    """The part of vLLM's `GET /server_info?config_format=json` the client reads (`rollout/server_info.py`): the
    log-prob mode (the loop reports processed log-probs: after temperature, top-k/p, min-p and the penalty), how
    many sequences it decodes at once, and no NCCL weight transfer (TRL's client checks `weight_transfer_config`)."""
    return {"vllm_config": {
        "model_config": {"model": served.name, "max_model_len": served.max_model_len,
                         "max_logprobs": served.max_logprobs, "logprobs_mode": "processed_logprobs"},
        "scheduler_config": {"max_num_seqs": max_num_seqs},
        "weight_transfer_config": None,
    }}
