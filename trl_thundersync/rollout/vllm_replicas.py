"""Replicas of `VLLMServerEngine`: per-server state, startup checks, health polling, publication fan-out, stats.

Each function here talks to one or all servers and knows nothing of batches or routing; `vllm_client.py` keeps the
engine's control flow.

Waiting for a server (`await_health`) follows TRL's `VLLMClient.check_server`: a server that refuses connections
may still be starting, so it is polled until `timeout` (TRL's `connection_timeout`, our `vllm_server_timeout`). Two
things end the wait early: the engine's `Cancellation` (close(), e.g. on Ctrl-C), and, for a server this process
owns (`ServerSupervisor`, the embedded servers), its process having exited — nothing will bring that one back by
waiting, so the caller gets `ServerExited` with the exit code and the log tail at once.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import AbortedSampleError, ConfigurationError, DeadEngineError, RolloutError, StalePolicyError
from .server_info import ServerLimits, read_limits
from .vllm_api import (
    Cancellation,
    EngineClosed,
    HTTPReply,
    check_base_url,
    error_message,
    http_call,
    parse_max_model_len,
    parse_model_ids,
)
from .vllm_publish import WeightPublisher

logger = logging.getLogger(__name__)

_POLL_S = 0.25  # how often /health is polled while waiting for a replica
_START_HINT = ("start it with `python -m trl_thundersync.serve --model PATH --port N`, or `vllm serve` (see "
               "trl_thundersync/serve/__init__.py)")


@dataclass(frozen=True)
class ReplicaStats:
    """One replica, since the engine was created."""

    url: str
    policy_version: int | None  # version the replica acknowledged serving
    in_flight: int  # requests routed to it and not yet answered
    requests: int  # answered requests
    tokens: int  # completion tokens received from it
    tokens_per_second: float  # tokens / seconds during which it had at least one request in flight
    retries: int  # requests sent again after a connection failure or a restart
    restarts: int  # times its process was restarted by the engine's supervisor (embedded servers only)
    alive: bool  # False once it failed to come back within restart_timeout


@dataclass(frozen=True)
class ServerEngineStats:
    """Counters of a `VLLMServerEngine`."""

    in_flight: int  # requests submitted and not yet answered, over all replicas
    peak_in_flight: int  # most requests in flight at once since the latest start_batch (or construction)
    trajectories: int  # rollouts delivered by results()
    tokens: int  # completion tokens over all answered requests
    time_to_first_result: float | None  # latest batch: start_batch → first rollout received
    turn_latency_p50: float | None  # seconds from submit to answer, over the last 4096 requests
    turn_latency_p90: float | None
    turn_latency_p99: float | None
    publications: int  # acknowledged publish() calls
    last_publication_seconds: float  # duration of the latest publish(), 0.0 before the first
    replicas: tuple[ReplicaStats, ...]


class ServerExited(RolloutError):
    """A server this process owns is not running any more (the message has its exit code and log tail)."""


class ServerSupervisor(Protocol):
    """The processes behind an engine's replicas, when this process started them (`serve.launcher.EmbeddedServers`).

    Lifecycle: the engine asks `exit_status(i)` whenever replica `i` fails to answer; a process that exited is
    `restart(i)`ed (at most `max_restarts` times per replica), and `close()` stops them all when the engine closes.
    """

    def exit_status(self, index: int) -> str | None:
        """None while server `index` runs; else how it ended: exit code (or signal) and the tail of its log."""
        ...

    def restart(self, index: int) -> str:
        """Start server `index` again from the weights it was first started with; returns its (new) URL once it
        listens, or raises `RolloutError` with its exit code and log tail."""
        ...

    def close(self) -> None: ...


class Replica:
    """Mutable state of one server; the engine guards every field but `recovery` with its own lock."""

    def __init__(self, index: int, url: str) -> None:
        self.index, self.url = index, url.rstrip("/")
        self.base_model = ""  # served name of the base model (first entry of /v1/models)
        self.max_model_len: int | None = None  # its context window, as /v1/models reports it (None: not reported)
        self.limits = ServerLimits(None, None, None)  # release, log-prob mode, max_num_seqs (`server_info`)
        self.version: int | None = None  # acknowledged version
        self.in_flight = self.assigned = 0  # assigned: trajectories routed here since the sticky table was cleared
        self.requests = self.tokens = self.retries = self.restarts = 0
        self.busy_seconds, self.busy_since = 0.0, 0.0  # time with ≥ 1 request in flight; start of the current span
        self.dead: str | None = None  # why it was declared dead
        self.engine_died = False  # declared dead because vLLM answered that its engine core died
        self.epoch = 0  # bumped by every recovery, so that concurrent failures recover once
        self.recovery = threading.Lock()  # one request at a time waits for a restart

    def refuse_if_dead(self) -> None:
        """Raise why this replica was declared dead (`DeadEngineError` if its vLLM engine died); nothing if alive."""
        if self.dead is not None:
            raise (DeadEngineError if self.engine_died else RolloutError)(self.dead)

    def begin(self) -> None:
        if self.in_flight == 0:
            self.busy_since = time.perf_counter()
        self.in_flight += 1

    def end(self, now: float) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.busy_seconds += now - self.busy_since

    def stats(self, now: float) -> ReplicaStats:
        busy = self.busy_seconds + (now - self.busy_since if self.in_flight else 0.0)
        return ReplicaStats(url=self.url, policy_version=self.version, in_flight=self.in_flight,
                            requests=self.requests, tokens=self.tokens,
                            tokens_per_second=self.tokens / busy if busy > 0 else 0.0, retries=self.retries,
                            restarts=self.restarts, alive=self.dead is None)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 1]); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def await_health(url: str, timeout: float, *, cancel: Cancellation | None = None,
                 exited: Callable[[], str | None] | None = None,
                 given_up: Callable[[], None] | None = None) -> HTTPReply:
    """Poll `GET /health` until it answers 200; `RolloutError` naming the URL after `timeout` seconds, at once when
    `cancel` is set, and `ServerExited` as soon as `exited()` reports that the server's process ended. `given_up()`
    is called at every poll and raises to end the wait (the replica was declared dead meanwhile)."""
    deadline, last, told = time.monotonic() + timeout, "no answer", False
    while True:
        if cancel is not None and cancel.is_set:
            raise RolloutError(f"the engine was closed while waiting for rollout server {url}")
        if given_up is not None:
            given_up()
        ended = exited() if exited is not None else None
        if ended is not None:
            raise ServerExited(f"rollout server {url} {ended}")
        try:
            reply = http_call(url, "GET", "/health", timeout=min(5.0, max(timeout, 0.1)), cancel=cancel)
            if reply.status == 200:
                return reply
            last = f"HTTP {reply.status} {error_message(reply)}"
        except EngineClosed:
            continue  # reported at the top of the loop
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise RolloutError(f"rollout server {url} is not reachable after {timeout:g} s ({last})")
        if not told and exited is None:  # TRL's client waits the same way for a server that is still starting
            logger.warning("rollout server %s does not answer yet (%s); waiting up to %g s for it to come up "
                           "(Ctrl-C stops the wait)", url, last, timeout)
            told = True
        if cancel is not None:
            cancel.wait(_POLL_S)
        else:
            time.sleep(_POLL_S)


def bring_back(replica: Replica, timeout: float, *, cancel: Cancellation, supervisor: ServerSupervisor | None,
               max_restarts: int, lock: threading.Lock) -> HTTPReply:
    """Wait for a failed `replica` to answer /health again; if `supervisor` owns it and its process died, restart it
    at once instead (at most `max_restarts` times; `lock` guards the replica's counters and URL)."""
    exited = None if supervisor is None else (lambda: supervisor.exit_status(replica.index))
    try:
        return await_health(replica.url, timeout, cancel=cancel, exited=exited, given_up=replica.refuse_if_dead)
    except ServerExited as exc:
        if replica.restarts >= max_restarts:
            raise RolloutError(f"{exc}\nIt was not restarted: {replica.restarts} restart(s) so far, "
                               f"max_restarts={max_restarts} (rollout_server_restarts)") from None
        logger.warning("%s; restarting it (restart %d of at most %d)", exc, replica.restarts + 1, max_restarts)
    with lock:
        replica.restarts += 1
    url = supervisor.restart(replica.index)
    with lock:
        replica.url = url
    return await_health(url, timeout, cancel=cancel, exited=exited, given_up=replica.refuse_if_dead)


def check_engine_options(base_urls: Sequence[str] | str, sampling: Any, *, max_concurrency: int, retries: int,
                         max_restarts: int) -> list[str]:
    """`VLLMServerEngine`'s arguments, checked; returns the base URLs as a list."""
    urls = [check_base_url(u, "base_urls") for u in ([base_urls] if isinstance(base_urls, str) else base_urls)]
    if not urls or len(set(urls)) != len(urls):
        raise ConfigurationError(f"base_urls={list(urls)} must name at least one server, each once")
    if sampling.temperature <= 0.0 or sampling.max_new_tokens < 1:
        raise ConfigurationError(f"SamplingParams temperature={sampling.temperature} and max_new_tokens="
                                 f"{sampling.max_new_tokens} must be > 0 (greedy decoding has no distribution)")
    if max_concurrency < 1 or retries < 0 or max_restarts < 0:
        raise ConfigurationError(f"max_concurrency={max_concurrency} must be >= 1, retries={retries} >= 0 and "
                                 f"max_restarts={max_restarts} >= 0")
    return urls


def connect_all(replicas: Sequence[Replica], timeout: float, *, cancel: Cancellation | None = None,
                supervisor: ServerSupervisor | None = None) -> list[int | None]:
    """Startup: wait for every replica, read its base model name; returns the versions they report (None: vLLM).

    A replica whose process (owned by `supervisor`) exited fails the start-up at once, with its exit code."""

    def connect(replica: Replica) -> int | None:
        exited = None if supervisor is None else (lambda: supervisor.exit_status(replica.index))
        health = await_health(replica.url, timeout, cancel=cancel, exited=exited)
        reply = http_call(replica.url, "GET", "/v1/models", timeout=30.0, cancel=cancel)
        if reply.status != 200:
            raise RolloutError(f"{replica.url} /v1/models failed: HTTP {reply.status} {error_message(reply)}")
        replica.base_model = parse_model_ids(reply.json())[0]
        replica.max_model_len = parse_max_model_len(reply.json())
        replica.limits = read_limits(replica.url, cancel=cancel)
        return health.policy_version

    with ThreadPoolExecutor(max_workers=len(replicas)) as pool:
        futures = [pool.submit(connect, r) for r in replicas]
    errors = [str(f.exception()) for f in futures if f.exception() is not None]
    if errors:
        raise RolloutError("; ".join(errors) + f"; {_START_HINT}")
    return [f.result() for f in futures]


def push_all(replicas: Sequence[Replica], publisher: WeightPublisher, version: int) -> list[str]:
    """Run `publisher.push` on every replica; returns one 'url: error' line per replica that did not acknowledge."""

    def push(replica: Replica) -> str | None:
        try:
            publisher.push(replica.url, version)
        except (RolloutError, OSError, ValueError) as exc:
            return f"{replica.url}: {exc}"
        return None

    if publisher.concurrent and len(replicas) > 1:
        with ThreadPoolExecutor(max_workers=len(replicas)) as pool:
            outcomes = list(pool.map(push, replicas))
    else:
        outcomes = [push(r) for r in replicas]
    return [o for o in outcomes if o is not None]


def check_completion(url: str, request: Any, completion: Any, max_tokens: int, *, served: int | None,
                     version: int) -> None:
    """One answer of `url` to `request` (a `RolloutRequest`; `completion` a `vllm_api.Completion`), checked: sampled
    at the batch's `version` (else `StalePolicyError`: refused, never relabelled), from the tokens it was sent, with
    1..`max_tokens` new tokens, and finished ("stop" or "length"; "abort"/"error": `AbortedSampleError`)."""
    if completion.finish_reason in ("abort", "error"):
        raise AbortedSampleError(f"trajectory {request.index}: {url} answered with finish_reason="
                                 f"{completion.finish_reason!r} after {len(completion.token_ids)} tokens: the sample "
                                 "was cut short (aborted, paused or failed on the server) and is refused")
    if served != version:
        raise StalePolicyError(f"trajectory {request.index}: {url} sampled it with policy version {served}, the "
                               f"batch is at version {version}; the sample is refused")
    if completion.prompt_ids is not None and completion.prompt_ids != tuple(request.prompt_ids):
        raise RolloutError(f"trajectory {request.index}: {url} generated from other prompt tokens than it was sent "
                           "(truncation or a chat template on the server?)")
    if not 1 <= len(completion.token_ids) <= max_tokens:
        raise RolloutError(f"trajectory {request.index}: {url} returned {len(completion.token_ids)} tokens for "
                           f"max_tokens={max_tokens}")


def restore_version(url: str, health: HTTPReply, *, version: int, published: bool, lora: bool,
                    publisher: WeightPublisher | None, rank: int) -> None:
    """After a restart: check the replica at `url` serves `version`, or have the publisher put it back.

    A follower (`publisher` None) cannot publish: rank 0 restores the replica, and until then the follower's
    per-response version check refuses what it serves; only a server that reports no version is refused here."""
    if not published:  # nothing published: it restarted from the weights it was started with
        if not lora and health.policy_version not in (None, version):
            raise StalePolicyError(f"it came back serving version {health.policy_version}, expected {version}")
        return
    if not lora and health.policy_version == version:
        return
    if publisher is None:
        if lora or health.policy_version is not None:
            return
        raise RolloutError(f"it came back without a version header, and rank {rank} cannot publish to it or tell "
                           "which weights it serves")
    if not publisher.restore(url, version):
        raise RolloutError(f"{type(publisher).__name__} cannot re-publish version {version} to a restarted server")


def server_metrics(stats: ServerEngineStats) -> dict[str, float]:
    """Flat metrics for the trainer's logs (`rollout/...`), one set per replica plus the engine-wide ones."""
    out = {"rollout/in_flight_peak": float(stats.peak_in_flight), "rollout/tokens": float(stats.tokens)}
    for name, value in (("time_to_first_result_s", stats.time_to_first_result),
                        ("turn_latency_p50_s", stats.turn_latency_p50), ("turn_latency_p90_s", stats.turn_latency_p90),
                        ("turn_latency_p99_s", stats.turn_latency_p99),
                        ("publication_s", stats.last_publication_seconds)):
        if value is not None:
            out[f"rollout/{name}"] = float(value)
    for i, replica in enumerate(stats.replicas):
        out[f"rollout/replica{i}/tokens_per_s"] = replica.tokens_per_second
        out[f"rollout/replica{i}/policy_version"] = float(-1 if replica.policy_version is None
                                                          else replica.policy_version)
        out[f"rollout/replica{i}/retries"] = float(replica.retries)
        out[f"rollout/replica{i}/restarts"] = float(replica.restarts)
        out[f"rollout/replica{i}/alive"] = float(replica.alive)
    return out
