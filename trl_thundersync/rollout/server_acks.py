"""What a rollout server itself confirms about a publication, read back before every batch (issue 14 item 3).

An acknowledgement the client only *remembers* cannot see a replica that restarted between two batches: it comes
back serving the weights it was started with, answers every request, and the samples carry the client's label. So
after each push the publisher writes a label the server stores, and before each batch it reads it back:

    POST /update_weight_version {"new_version": "policy-<run>-v<k>"} -> {"success": true, "new_version": ...}
    GET  /weight_info                                                -> {"weight_version": "policy-<run>-v<k>"}

(vLLM >= 0.27, `vllm/entrypoints/serve/dev/rlhf/api_router.py`, served only with `VLLM_SERVER_DEV_MODE=1`; a fresh
vLLM reports "default", and so does the embedded server.) The full-weight publishers (`HTTPWeightFile`,
`TRLNCCLPublisher`) use it; the label carries the run id, so a server that another run published to is caught too.
A server without the routes (vLLM <= 0.26, or no dev mode) answers FastAPI's 404 `{"detail": "Not Found"}`: its
label is then not checked (`Acknowledgements.unchecked`, logged once per replica). The LoRA publisher needs no
label: its acknowledgement is the adapter name in `/v1/models`, which a restarted server has forgotten (any vLLM
version, no dev mode), and a server-wide label would be overwritten by other runs sharing a LoRA server.

`reset_prefix_cache` retries vLLM >= 0.26's `{"success": false}` (blocks still held, e.g. by requests of another
client or an async KV offload) a bounded number of times. `adapter_load_error` turns a refused
`/v1/load_lora_adapter` into an `AdapterLoadError` that tells a missing route from a path the server cannot read,
with vLLM's own text (`vllm/entrypoints/openai/models/serving.py`, `vllm/exceptions.py`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import AdapterLoadError, ReplicaRestartedError, RolloutError
from .vllm_api import HTTPReply, error_message, http_call

logger = logging.getLogger(__name__)

RESTARTING = (502, 503, 504)  # answers of a proxy or of a server still loading: unreachable for now, not an error
RESET_ATTEMPTS = 5  # /reset_prefix_cache calls before {"success": false} is an error
RESET_BACKOFF_S = 0.2  # first wait between them; doubled after each refusal (0.2 + 0.4 + 0.8 + 1.6 s at most)
_NO_ADAPTER = "No adapter found"  # vLLM's LoRAAdapterNotFoundError: lora_path has no adapter the server can open
_DUPLICATE = "has already been loaded"  # vLLM's 400 for a name that is loaded (without load_inplace)
_LORA_HINT = ("start vLLM with --enable-lora --max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 in its "
              "environment")


def new_run_id() -> str:
    """Eight hex digits naming one run's adapters and weight labels, so that a server that outlives a run (or is
    reused after resume_from_checkpoint) never sees a name twice."""
    return uuid.uuid4().hex[:8]


def route_absent(reply: HTTPReply) -> bool:
    """A 404 from the web framework (no such route), not a vLLM error answer: FastAPI's `{"detail": "Not Found"}`
    carries no `message`, vLLM's own 404s (`NotFoundError`) always do."""
    if reply.status != 404:
        return False
    try:
        body = reply.json()
    except ValueError:
        return True
    if not isinstance(body, dict):
        return True
    inner = body.get("error") if isinstance(body.get("error"), dict) else body
    return "message" not in inner


def reset_prefix_cache(url: str, timeout: float, *, attempts: int = RESET_ATTEMPTS,
                       sleep: Callable[[float], None] = time.sleep) -> int:
    """`POST /reset_prefix_cache` until it succeeds; returns the attempts it took. vLLM >= 0.26 answers
    `{"success": bool}` (false while cache blocks are still held: retried), older versions an empty 200."""
    wait = RESET_BACKOFF_S
    for attempt in range(1, attempts + 1):
        reply = http_call(url, "POST", "/reset_prefix_cache", timeout=timeout)
        if reply.status != 200:
            raise RolloutError(f"{url} could not reset its prefix cache: HTTP {reply.status} {error_message(reply)} "
                               "(vLLM serves this endpoint only with VLLM_SERVER_DEV_MODE=1)")
        try:
            body = reply.json()
        except ValueError:
            body = None
        if not (isinstance(body, dict) and body.get("success") is False):
            return attempt
        if attempt < attempts:
            logger.info("%s answered {'success': false} to /reset_prefix_cache; retrying in %.1f s", url, wait)
            sleep(wait)
            wait *= 2
    raise RolloutError(f"{url} answered {{'success': false}} to /reset_prefix_cache {attempts} times: its cache "
                       "blocks are still held (requests of another client, or an async KV offload in flight), so "
                       "the old policy's cached prefixes could be reused with the new weights")


def set_weight_version(url: str, label: str, timeout: float) -> bool:
    """Have the server store `label` as its weight version; False when it has no such route (checked: never)."""
    reply = http_call(url, "POST", "/update_weight_version", {"new_version": label}, timeout=timeout)
    if route_absent(reply):
        return False
    body = reply.json() if reply.status == 200 else None
    if not (isinstance(body, dict) and body.get("success") is True and body.get("new_version") == label):
        raise RolloutError(f"{url} did not confirm weight version {label!r}: HTTP {reply.status} "
                           f"{error_message(reply) if reply.status != 200 else body}")
    return True


def read_weight_version(url: str, timeout: float) -> str | None:
    """The weight version the server reports (`GET /weight_info`), None when it has no such route."""
    reply = http_call(url, "GET", "/weight_info", timeout=timeout)
    if route_absent(reply):
        return None
    if reply.status in RESTARTING:
        raise ConnectionError(f"{url} GET /weight_info: HTTP {reply.status} (restarting)")
    body = reply.json() if reply.status == 200 else None
    if not isinstance(body, dict) or not isinstance(body.get("weight_version"), str):
        raise RolloutError(f"{url} GET /weight_info failed: HTTP {reply.status} "
                           f"{error_message(reply) if reply.status != 200 else body}")
    return body["weight_version"]


class Acknowledgements:
    """The weight label each replica confirmed storing, and the check that it still reports it."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._labels: dict[str, str | None] = {}  # url -> label it stored; None: it has no version routes

    def record(self, url: str, label: str) -> None:
        """After a push to `url`: store `label` there (a server without the routes is noted once)."""
        confirmed = set_weight_version(url, label, self.timeout)
        if not confirmed and self._labels.get(url, "") is not None:
            logger.warning("%s has no /update_weight_version (vLLM < 0.27, or VLLM_SERVER_DEV_MODE unset): a restart "
                           "of it between batches is not detected from its weight version", url)
        self._labels[url] = label if confirmed else None

    @property
    def unchecked(self) -> tuple[str, ...]:
        """Replicas published to whose weight version cannot be read back."""
        return tuple(url for url, label in self._labels.items() if label is None)

    def problem(self, url: str, label: str) -> str | None:
        """Why `url` does not confirm `label` now, or None (also None when it was never published to, or cannot
        report a version)."""
        if self._labels.get(url) is None:
            return None
        served = read_weight_version(url, self.timeout)
        if served is None:
            return "no longer serves GET /weight_info (it restarted without VLLM_SERVER_DEV_MODE=1?)"
        if served != label:
            return (f"reports weight version {served!r} instead of {label!r}: it restarted after the publication "
                    "(and serves the weights it was started with) or another trainer published to it")
        return None


def confirm_all(urls: Sequence[str], publisher: Any, version: int) -> None:
    """Before a batch: every replica must still confirm `version`. A replica that does not is given it again when
    the publisher can (`restore`); otherwise `ReplicaRestartedError` names it."""
    for url in urls:
        try:
            problem = publisher.confirm(url, version)
        except OSError as exc:  # down or restarting: its requests wait for it, and its recovery restores the version
            logger.info("rollout replica %s could not be checked before the batch (%s)", url, exc)
            continue
        if problem is None:
            continue
        if publisher.restore(url, version) and publisher.confirm(url, version) is None:
            logger.warning("rollout replica %s %s; policy version %d was published to it again", url, problem,
                           version)
            continue
        raise ReplicaRestartedError(
            f"rollout replica {url} {problem}; {type(publisher).__name__} cannot put policy version {version} back, "
            "so the batch is refused instead of sampled from other weights", url=url)


def adapter_load_error(url: str, name: str, path: str, reply: HTTPReply) -> AdapterLoadError:
    """The error for a refused `POST /v1/load_lora_adapter`, naming why, with the server's own message."""
    message = error_message(reply)
    said = f"HTTP {reply.status} {message}"
    if route_absent(reply):
        kind, text = "route absent", f"{url} has no /v1/load_lora_adapter route ({said}): {_LORA_HINT}"
    elif _NO_ADAPTER in message:
        kind = "path unreadable"
        text = (f"{url} cannot read adapter {name!r} at {path} ({said}): the server opens lora_path on its own "
                "filesystem; a server on another host needs vllm_publish_dir set to a folder both machines "
                "mount at the same path, readable by the server's user")
    elif reply.status == 400 and _DUPLICATE in message:
        kind = "duplicate name"
        text = (f"{url} already has an adapter named {name!r} ({said}); adapter names carry a per-run id, so "
                "another engine of this run loaded it")
    else:
        kind, text = "refused", f"{url} refused adapter {name!r} from {path}: {said}"
    return AdapterLoadError(text, url=url, adapter=name, kind=kind, server_message=message)


class ConfirmGate:
    """`confirm_all` once per published version, before the first request of it is sent (a batch's `start_batch`
    and the agent loop's per-turn `submit` both pass here); concurrent callers wait for the one that checks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._confirmed: int | None = None  # the version every replica confirmed last

    def check(self, urls: Sequence[str], publisher: Any, version: int) -> None:
        if publisher is None or not hasattr(publisher, "confirm") or self._confirmed == version:
            return
        with self._lock:
            if self._confirmed != version:
                confirm_all(urls, publisher, version)
                self._confirmed = version
