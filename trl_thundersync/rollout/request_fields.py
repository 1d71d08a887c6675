"""TRL's `generation_kwargs` and `vllm_structured_outputs_regex` as fields of vLLM's `/v1/completions` request, and
the checks that keep the samples what TRL would draw.

TRL's `VLLMClient.generate` (server mode) builds its request as `{sampling fields} | {"structured_outputs": {"regex":
r}} | generation_kwargs`: the regex becomes vLLM's `structured_outputs`, and every `generation_kwargs` key goes into
the body as it is, overriding the fields TRL set. `request_fields` does the same with three differences, each a
refusal by name instead of a silent departure:

- a key vLLM's `CompletionRequest` does not have (in any release 0.22 … 0.31) is refused: vLLM's request models allow
  and ignore unknown fields (`OpenAIBaseModel`, `extra="allow"`, logged at debug), so a typo or a name of vLLM's
  offline `SamplingParams` (`best_of`, `max_new_tokens`, `guided_decoding`, ...) would be dropped silently;
- a key the config or the engine owns is refused with the field to use instead: overriding `temperature` only on
  the server would make the learner score under another distribution than the one that sampled, and `seed`,
  `logprobs`, `return_token_ids`, `stop_token_ids`, ... are what the engine needs to read its answers exactly;
- `vllm_structured_outputs_regex` together with `generation_kwargs["structured_outputs"]` is refused (TRL's server
  mode lets the kwargs win, its colocate mode the regex).

`VLLM_COMPLETION_FIELDS` is the union of `CompletionRequest`'s fields over the supported releases, with the first
release that has each; `tests/unit/rollout/test_vllm_contract.py` checks it against the frozen contract
(`tests/data/vllm_contract.json`, made by `scripts/vllm_contract.py` from the wheels). A field newer than a server's
release is refused once the engine read the server's `/version` (`check_server_release`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigurationError

OLDEST = "0.22"  # the oldest vLLM release the package supports
# vLLM's `CompletionRequest` fields (0.22 … 0.31) -> the first supported release that has the field.
VLLM_COMPLETION_FIELDS: dict[str, str] = {
    **dict.fromkeys((
        "add_special_tokens", "allowed_token_ids", "cache_salt", "echo", "frequency_penalty", "ignore_eos",
        "include_stop_str_in_output", "kv_transfer_params", "length_penalty", "logit_bias", "logprobs", "max_tokens",
        "min_p", "min_tokens", "model", "n", "presence_penalty", "priority", "prompt", "prompt_embeds",
        "prompt_logprobs", "repetition_detection", "repetition_penalty", "request_id", "response_format",
        "return_token_ids", "return_tokens_as_token_ids", "seed", "skip_special_tokens",
        "spaces_between_special_tokens", "stop", "stop_token_ids", "stream", "stream_options", "structured_outputs",
        "suffix", "temperature", "thinking_token_budget", "top_k", "top_p", "truncate_prompt_tokens",
        "truncation_side", "use_beam_search", "user", "vllm_xargs"), OLDEST),
    "bad_words": "0.26", "ec_transfer_params": "0.26", "logprob_token_ids": "0.26", "return_token_offsets": "0.26",
    "stream_interval": "0.27", "routed_experts_prompt_start": "0.28", "session_id": "0.28", "watermarking": "0.31",
}
# Fields the config or the engine sets on every request: key -> what to use instead / why the engine needs it.
OWNED: dict[str, str] = {
    "model": "the engine names the served model (or the policy's adapter)",
    "prompt": "the engine sends the chat-templated prompt token ids",
    "prompt_embeds": "the engine sends token ids",
    "max_tokens": "set max_completion_length (the agent loop sets each turn's budget)",
    "temperature": "set temperature: the learner scores the samples at the config's temperature",
    "top_p": "set top_p", "top_k": "set top_k", "min_p": "set min_p",
    "repetition_penalty": "set repetition_penalty",
    "seed": "the engine seeds every trajectory itself, so a sample does not depend on scheduling",
    "n": "the engine sends one request per trajectory (num_generations sets the group size)",
    "logprobs": "the engine asks for the sampled token's log-prob", "logprob_token_ids": "see logprobs",
    "prompt_logprobs": "used by teacher scoring only", "echo": "the engine reads only the new tokens",
    "return_token_ids": "the engine reads token ids", "return_tokens_as_token_ids": "see return_token_ids",
    "return_token_offsets": "see return_token_ids",
    "stop_token_ids": "the engine stops at the tokenizer's EOS ids (generation_config / eos_token)",
    "ignore_eos": "see stop_token_ids", "skip_special_tokens": "the engine decodes nothing on the server",
    "stream": "the engine reads whole answers", "stream_options": "see stream", "stream_interval": "see stream",
    "use_beam_search": "beam search has no sampling distribution for the policy gradient",
    "truncate_prompt_tokens": "a truncated prompt is not the context the learner scores",
    "truncation_side": "see truncate_prompt_tokens", "suffix": "the engine's prompts have no suffix",
    "request_id": "the engine's requests are independent", "add_special_tokens": "the prompt is token ids already",
}
# Forwarded fields that leave vLLM's sampling distribution as the config fields define it.
NEUTRAL = frozenset({"user", "priority", "cache_salt", "kv_transfer_params", "ec_transfer_params",
                     "spaces_between_special_tokens", "session_id", "routed_experts_prompt_start", "length_penalty"})


def request_fields(generation_kwargs: Mapping[str, Any] | None, structured_outputs_regex: str | None) -> dict:
    """The extra `/v1/completions` fields for TRL's two generation fields, as TRL's server client maps them; raises
    `ConfigurationError` naming the field for what vLLM would ignore or the engine must set itself."""
    kwargs = dict(generation_kwargs or {})
    unknown = sorted(k for k in kwargs if k not in VLLM_COMPLETION_FIELDS)
    if unknown:
        raise ConfigurationError(
            f"generation_kwargs keys {unknown} are not fields of vLLM's /v1/completions request (vLLM {OLDEST} … "
            "0.31 ignore unknown fields, so they would be dropped silently); use the request's field names, e.g. "
            "'presence_penalty', 'frequency_penalty', 'logit_bias', 'stop', 'min_tokens', 'structured_outputs'")
    owned = sorted(k for k in kwargs if k in OWNED)
    if owned:
        raise ConfigurationError("generation_kwargs may not set " + "; ".join(f"{k!r} ({OWNED[k]})" for k in owned))
    if structured_outputs_regex is not None:
        if kwargs.get("structured_outputs") is not None:
            raise ConfigurationError(
                "vllm_structured_outputs_regex and generation_kwargs['structured_outputs'] are both set; set one "
                "(TRL's server client lets generation_kwargs win, its colocate mode the regex)")
        kwargs["structured_outputs"] = {"regex": str(structured_outputs_regex)}
    return kwargs


def sampling_departures(sampling: Any, extra: Mapping[str, Any]) -> list[str]:
    """What makes the sampling distribution differ from the model's softmax (raw log-probs then differ from the
    sampler's): the non-default config fields and every extra field that is not `NEUTRAL`."""
    off = {"temperature": (1.0,), "top_p": (1.0,), "top_k": (0, -1), "min_p": (0.0,), "repetition_penalty": (1.0,)}
    changed = [f"{name}={getattr(sampling, name)!r}" for name, values in off.items()
               if getattr(sampling, name) not in values]
    return changed + [f"{name}={value!r}" for name, value in extra.items() if name not in NEUTRAL]


def _release(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


def check_server_release(url: str, release: str | None, extra: Mapping[str, Any]) -> None:
    """Refuse extra fields newer than the vLLM release at `url` (from its `GET /version`; None: not vLLM, or not
    reported — nothing is checked, the embedded server refuses what it does not implement)."""
    if release is None:
        return
    too_new = sorted(k for k in extra if _release(VLLM_COMPLETION_FIELDS.get(k, OLDEST)) > _release(release))
    if too_new:
        raise ConfigurationError(
            f"{url} runs vLLM {release}, which ignores the request fields "
            + ", ".join(f"{k!r} (vLLM >= {VLLM_COMPLETION_FIELDS[k]})" for k in too_new)
            + " of generation_kwargs; upgrade the server or drop them")
