"""`VLLMServerEngine`: rollouts from vLLM servers (or the embedded server) over vLLM's OpenAI-compatible HTTP API.

    engine = VLLMServerEngine(["http://10.0.0.5:8000", "http://10.0.0.6:8000"], tokenizer, sampling)
    engine.start_batch(requests, policy_version=k); for rollout in engine.results(): ...   # completion order
    engine.publish(model, policy_version=k + 1)     # returns once every replica serves k + 1

Implements the `RolloutEngine` contract (`engine.py`) and, like `LocalProcessEngine`, `submit(request, key=...,
max_new_tokens=...) -> Future[Rollout]` for the multi-turn agent loop (one HTTP request per turn).

- Requests: one `POST /v1/completions` per turn, token ids in, token ids and processed log-probs out (`vllm_api`),
  seeded with `request.seed`, plus `request_fields` (TRL's generation fields, `request_fields.py`). At most
  `max_concurrency` requests are on the wire (None: the servers' `max_num_seqs`, `server_info`); each future resolves
  the moment its answer arrives. A sample cut short (finish_reason "abort"/"error") is refused. At start, every
  server's tokenizer, release and (`importance_sampling`) `--logprobs-mode` are checked (`server_info`).
- Back-pressure: requests beyond `max_concurrency` wait in this client, not on the servers; and nothing of batch
  k+1 is sent before the learner closed batch k and every replica acknowledged θ_{k+1}, so the rollouts buffered
  ahead of the learner never exceed one logical batch.
- Routing: replicas are data-parallel copies. A trajectory (`request.index`) is sent to the least-loaded live
  replica on its first turn and stays there for its later turns (the replica's prefix cache holds its context);
  the table is cleared at every `start_batch` and `publish`.
- Failures: a refused or reset connection, or HTTP 502/503/504, means the replica is restarting. The request waits
  (at most `restart_timeout` s, polling `/health`) until it is back, the publisher puts the current policy version
  back if the restart lost it, and the request is sent again (`retries` times at most); the same seed gives the same
  sample. A replica that does not come back is declared dead: every request routed to it fails with
  `RolloutError`, so `results()` raises instead of yielding a partial batch, and the engine refuses further use.
  A timeout (`request_timeout`) fails the request without retrying (it may still be running there). HTTP 500 is
  sent again at once, then after 4, 8 ... s (TRL's client's urllib3 schedule), within the same `retries` — except
  vLLM's answer that its engine core died (`vllm_api.engine_dead`): that replica is declared dead at once (the
  requests waiting for it too) and the batch fails with `DeadEngineError` naming vLLM's message, since vLLM never
  revives a dead engine and its server exits; a server that was restarted (refused connections, then /health 200 at
  the same URL) is still waited for.
- Owned servers (`supervisor`: the embedded servers the trainer started): nothing else restarts one whose process
  died, so it is not waited for but restarted at once (`max_restarts` times per replica at most), given the current
  version, and sent the requests again with their seeds; otherwise the batch fails at once with its exit code.
- Closing: `close()` (on Ctrl-C too, from the trainer's `finally`) aborts the requests in flight and every wait.
- Versions: every `Rollout` carries the version the server reported — the embedded server's
  `x-thundersync-policy-version` header, or the `policy-<run id>-v{k}` adapter name in LoRA mode. Real vLLM serving full
  weights reports none; then the version the replica acknowledged at publication is used (no request is in flight
  during a publication, so nothing can mix versions). A mismatch with the engine's version raises
  `StalePolicyError`: the sample is refused, never relabelled. Before the first request of each published version,
  rank 0 reads back the label every replica confirmed storing (`server_acks`: vLLM >= 0.27's `/weight_info`, or
  the adapter in `/v1/models`): a replica that restarted between batches is given the version again, or refused
  with `ReplicaRestartedError`. `publish_first=True`: the caller publishes right after construction, so replicas
  reporting another version (a server reused from an earlier run) are not refused at construction.
- Publication: `publish()` refuses while requests are in flight, then runs the `WeightPublisher` (`vllm_publish`)
  on every replica and returns only when each of them acknowledged the new version.
- Several learner processes (`role`, `publish_role`): each rank has its own engine and sends its own requests;
  only rank 0 builds the publisher and pushes, and every rank's `publish()` returns together once the replicas
  acknowledged (rank 0's failure is raised on every rank).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import DeadEngineError, RolloutError, StalePolicyError
from ..types import Rollout, RolloutRequest, SamplingParams
from .batches import SubmittedBatch
from .publish_role import SINGLE_PROCESS, PublishRole, run_on_main
from .publisher_choice import make_publisher
from .server_acks import ConfirmGate
from .server_info import ServerLimits, default_concurrency, startup_checks
from .vllm_api import (
    Cancellation,
    Completion,
    EngineClosed,
    HTTPReply,
    completion_payload,
    dead_engine_message,
    engine_dead,
    error_message,
    http_call,
    lora_name,
    lora_version,
    parse_completion,
    resend_pause,
)
from .vllm_publish import WeightPublisher
from .vllm_replicas import (
    Replica,
    ReplicaStats,
    ServerEngineStats,
    ServerSupervisor,
    bring_back,
    check_completion,
    check_engine_options,
    connect_all,
    percentile,
    push_all,
    restore_version,
    server_metrics,
)

__all__ = ["ReplicaStats", "ServerEngineStats", "VLLMServerEngine"]

logger = logging.getLogger(__name__)

_RESTARTING = (502, 503, 504)  # a proxy or a server that is still loading: wait for it like for a restart
_SERVER_ERROR = 500  # failed inside a running server: sent again after a backoff, as TRL's client does
_LATENCY_WINDOW = 4096  # per-turn latencies kept for the percentiles


class VLLMServerEngine:
    """`RolloutEngine` and `TurnGenerator` over HTTP rollout servers (lifecycles in `engine.py`)."""

    def __init__(self, base_urls: Sequence[str], tokenizer: Any, sampling: SamplingParams, *,
                 publisher: WeightPublisher | str = "auto", max_concurrency: int | None = None,
                 request_timeout: float = 600.0, startup_timeout: float = 120.0, retries: int = 3,
                 restart_timeout: float = 300.0, policy_version: int = 0, on_close: Callable[[], None] | None = None,
                 nccl_options: Mapping[str, Any] | None = None, supervisor: ServerSupervisor | None = None,
                 max_restarts: int = 3, role: PublishRole = SINGLE_PROCESS, publish_first: bool = False,
                 request_fields: Mapping[str, Any] | None = None, importance_sampling: bool = False) -> None:
        urls = check_engine_options(base_urls, sampling, retries=retries, max_restarts=max_restarts,
                                    max_concurrency=1 if max_concurrency is None else max_concurrency)
        self._extra = dict(request_fields or {})  # fields added to every generation request (`request_fields`)
        self.sampling, self.retries, self.max_restarts = sampling, retries, max_restarts
        self._on_close = on_close
        self.supervisor = supervisor  # the processes behind the replicas, if this process started them
        self._cancel = Cancellation()  # set by close(): aborts requests in flight and waits for servers
        self.request_timeout, self.restart_timeout = request_timeout, restart_timeout
        self._replicas = [Replica(i, u) for i, u in enumerate(urls)]
        self._lock = threading.Lock()
        self._version = self._initial_version = policy_version
        self._publications, self._last_pub = 0, 0.0
        self._keys: set[Any] = set()  # keys of requests in flight
        self._sticky: dict[int, Replica] = {}  # trajectory index -> replica
        self._latencies: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        self._trajectories, self._ttfr = 0, None
        self._peak_in_flight = 0
        self._batch = SubmittedBatch("the servers serve")  # the open logical batch (start_batch/results)
        self._batch_started = 0.0
        self._publishing = self._closed = False
        self._failure: str | None = None
        self._failure_type: type[RolloutError] = RolloutError  # DeadEngineError once a replica's engine died
        self._pool: ThreadPoolExecutor | None = None  # sized once the servers reported their limits
        self.role = role  # rank 0 publishes; followers only learn the new version (`publish_role`)
        self._publisher: WeightPublisher | None = None  # None on a follower: it never publishes
        self._lora = publisher == "lora" or bool(getattr(publisher, "lora", False))  # requests name the adapter
        self._prefix = getattr(publisher, "prefix", "policy")  # the adapters' name prefix (`lora_name`)
        self._gate = ConfirmGate()  # before a version's first request: every replica still confirms it
        try:
            reported = connect_all(self._replicas, startup_timeout, cancel=self._cancel, supervisor=supervisor)
            if role.main:
                self._publisher = make_publisher(publisher, reported, nccl_options)
                self._lora, self._prefix = self._publisher.lora, getattr(self._publisher, "prefix", "policy")
            stale = [f"{r.url} serves {v}" for r, v in zip(self._replicas, reported, strict=True)
                     if v not in (None, policy_version)]
            if stale and not self._lora and not publish_first:  # with LoRA the header is the base weights' version
                raise StalePolicyError(f"the engine was created for policy version {policy_version}, but "
                                       + ", ".join(stale))
            startup_checks(self._replicas, tokenizer, sampling, self._extra, importance_sampling=importance_sampling)
            if self._publisher is not None and hasattr(self._publisher, "check_base"):  # LoRA: the first batch
                for replica in self._replicas:                                         # samples the base model
                    self._publisher.check_base(replica.url)
            self.max_concurrency = (default_concurrency([r.limits for r in self._replicas]) if max_concurrency is None
                                    else max_concurrency)  # requests on the wire at most, over all replicas
            self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="thundersync-vllm")
        except BaseException:
            self.close()
            raise
        for replica in self._replicas:
            replica.version = policy_version

    # -- per-request interface ----------------------------------------------------------------------------------
    def submit(self, request: RolloutRequest, *, key: Any = None, max_new_tokens: int | None = None) -> Future:
        """Send one generation; the future resolves to a `Rollout` (completion = this request's new tokens).

        `key` must be unique among in-flight requests (default `request.index`); `max_new_tokens` overrides the
        sampling default for this request (the agent loop's per-turn budget).
        """
        self._check_usable()
        self._confirm_served()
        if len(request.prompt_ids) == 0:
            raise RolloutError(f"request {request.index} has empty prompt_ids")
        key = request.index if key is None else key
        with self._lock:
            if self._publishing:
                raise RolloutError("a publication is in progress; requests must wait for publish() to return")
            if key in self._keys:
                raise RolloutError(f"a request with key {key!r} is already in flight")
            replica = self._route(request.index)
            self._keys.add(key)
            replica.begin()
            self._peak_in_flight = max(self._peak_in_flight, len(self._keys))
            version = self._version
        max_tokens = max_new_tokens or self.sampling.max_new_tokens
        return self._pool.submit(self._generate, replica, request, key, max_tokens, version)

    def _confirm_served(self) -> None:
        """Before the first request of a published version: each replica must still confirm it (`server_acks`)."""
        if self._publishing:
            return  # submit() refuses the request: a publication is in progress
        try:
            self._gate.check(self.base_urls, self._publisher if self._publications else None, self._version)
        except (RolloutError, OSError) as exc:
            self._failure = self._failure or str(exc)
            raise

    # -- RolloutEngine ------------------------------------------------------------------------------------------
    def start_batch(self, requests: Sequence[RolloutRequest], policy_version: int) -> None:
        self._check_usable()
        self._batch.start(self.submit, requests, policy_version, serving_version=self._version,
                          prepare=self._new_batch)

    def results(self) -> Iterator[Rollout]:
        for rollout in self._batch.results():  # a failed batch is over: nothing partial is handed on
            self._trajectories += 1
            if self._ttfr is None:
                self._ttfr = time.perf_counter() - self._batch_started
            yield rollout

    def publish(self, model: Any, policy_version: int) -> float:
        """Every process calls it once per version: rank 0 pushes θ, and all return once every replica acknowledged
        (with several processes, rank 0's failure is raised on every rank: `publish_role.run_on_main`)."""
        self._check_usable()
        with self._lock:
            if self._batch.open is not None or self._keys:
                raise RolloutError(f"cannot publish while a batch is open ({len(self._keys)} requests in flight); "
                                   "it must close first")
            self._publishing = True
        try:
            start = time.perf_counter()
            try:
                acknowledged, self._prefix = run_on_main(self.role, f"publishing policy version {policy_version}",
                                                         lambda: self._push_everywhere(model, policy_version))
            except RolloutError as exc:
                self._failure = self._failure or str(exc)
                raise
            if acknowledged != policy_version:
                self._failure = (f"rank {self.role.rank} published version {policy_version} while rank 0 published "
                                 f"{acknowledged}: the processes are out of step")
                raise RolloutError(self._failure)
            previous = self._version
            with self._lock:
                for replica in self._replicas:
                    replica.version = policy_version
                self._version = policy_version
                self._publications += 1
            self._clear_routes()
            if previous != policy_version and self._publisher is not None:
                self._publisher.retire([r.url for r in self._replicas], previous)
            self._last_pub = time.perf_counter() - start
            logger.info("policy version %d acknowledged by %d replica(s) in %.3f s (rank %d, %s)", policy_version,
                        len(self._replicas), self._last_pub, self.role.rank,
                        type(self._publisher).__name__ if self._publisher else "published by rank 0")
            return self._last_pub
        finally:
            self._publishing = False

    def _push_everywhere(self, model: Any, policy_version: int) -> tuple[int, str]:
        """The main process's part of `publish`: θ to every replica; returns the version they all acknowledged and
        the adapters' name prefix (it carries rank 0's run id, which the followers' requests must name too)."""
        self._revive_exited()
        self._publisher.prepare(model, policy_version)
        failures = push_all(self._replicas, self._publisher, policy_version)
        if failures:
            self._failure = f"publication of version {policy_version} failed on " + "; ".join(failures)
            raise RolloutError(self._failure + ". Replicas now serve different versions: create a new engine.")
        return policy_version, self._prefix

    def close(self) -> None:
        """Abort what is in flight, stop the owned servers, remove the publisher's files; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._cancel.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            if self._publisher is not None:
                self._publisher.close()
        finally:
            try:
                if self.supervisor is not None:
                    self.supervisor.close()
            finally:
                if self._on_close is not None:
                    self._on_close()

    @property
    def policy_version(self) -> int:
        """The version every replica acknowledged serving."""
        return self._version

    @property
    def publisher(self) -> WeightPublisher | None:
        """What rank 0 publishes with (for 'auto', the publisher it chose); None on the other ranks."""
        return self._publisher

    @property
    def base_urls(self) -> tuple[str, ...]:
        return tuple(r.url for r in self._replicas)

    @property
    def server_limits(self) -> tuple[ServerLimits, ...]:
        """What each replica reported at connection: vLLM release, --logprobs-mode, max_num_seqs (`server_info`)."""
        return tuple(r.limits for r in self._replicas)

    @property
    def max_model_len(self) -> int | None:
        """The smallest context window the replicas reported (prompt + generated tokens), None if none did."""
        known = [r.max_model_len for r in self._replicas if r.max_model_len is not None]
        return min(known) if known else None

    def step_metrics(self) -> dict[str, float]:
        """Per-replica and engine-wide rollout metrics for the trainer's logs (`server_metrics`)."""
        return server_metrics(self.stats())

    def stats(self) -> ServerEngineStats:
        now = time.perf_counter()
        with self._lock:
            replicas = tuple(r.stats(now) for r in self._replicas)
            latencies = list(self._latencies)
        return ServerEngineStats(
            in_flight=sum(r.in_flight for r in replicas), peak_in_flight=self._peak_in_flight,
            trajectories=self._trajectories,
            tokens=sum(r.tokens for r in replicas), time_to_first_result=self._ttfr,
            turn_latency_p50=percentile(latencies, 0.5), turn_latency_p90=percentile(latencies, 0.9),
            turn_latency_p99=percentile(latencies, 0.99), publications=self._publications,
            last_publication_seconds=self._last_pub, replicas=replicas,
        )

    # -- one request ----------------------------------------------------------------------------------------------
    def _generate(self, replica: Replica, request: RolloutRequest, key: Any, max_tokens: int, version: int) -> Rollout:
        started, completion = time.perf_counter(), None
        try:
            model = (lora_name(self._prefix, version) if self._lora and self._publications
                     else replica.base_model)
            payload = completion_payload(model, request.prompt_ids, self.sampling, max_tokens=max_tokens,
                                         seed=request.seed, extra=self._extra)
            reply = self._post(replica, payload, request.index)
            try:
                completion = parse_completion(reply.json())
            except ValueError as exc:
                raise RolloutError(
                    f"{replica.url} answered trajectory {request.index} with invalid JSON: {exc}") from exc
            served = self._served_version(replica, completion, reply)
            check_completion(replica.url, request, completion, max_tokens, served=served, version=version)
        finally:
            finished = time.perf_counter()
            with self._lock:  # released before the future resolves: publish() right after a result sees it
                self._keys.discard(key)
                replica.end(finished)
                self._latencies.append(finished - started)
                if completion is not None:
                    replica.requests += 1
                    replica.tokens += len(completion.token_ids)
        return Rollout(index=request.index, group=request.group, policy_version=served,
                       prompt_ids=tuple(request.prompt_ids), completion_ids=completion.token_ids,
                       sampling_logprobs=completion.logprobs, started_at=started, finished_at=finished)

    def _post(self, replica: Replica, payload: dict, index: int) -> HTTPReply:
        """POST /v1/completions, waiting out replica restarts; raises `RolloutError` when the replica is gone."""
        failure = ""
        for attempt in range(self.retries + 1):
            replica.refuse_if_dead()
            epoch, status = replica.epoch, None
            try:
                reply = http_call(replica.url, "POST", "/v1/completions", payload, timeout=self.request_timeout,
                                  cancel=self._cancel)
            except EngineClosed:
                raise RolloutError(f"trajectory {index}: the engine was closed while it was in flight") from None
            except TimeoutError:
                raise RolloutError(f"trajectory {index}: no answer from {replica.url} within "
                                   f"{self.request_timeout:g} s (request_timeout)") from None
            except OSError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                lost_adapter = self._lora and reply.status == 404  # a restarted vLLM forgot the adapter
                if reply.status == 200:
                    return reply
                status, failure = reply.status, f"HTTP {reply.status} {error_message(reply)}"
                if engine_dead(reply):
                    self._declare_dead(replica, dead_engine_message(replica.url, failure), engine=True)
                    raise DeadEngineError(f"trajectory {index}: {replica.dead}")
                if reply.status not in (*_RESTARTING, _SERVER_ERROR) and not lost_adapter:
                    raise RolloutError(f"trajectory {index}: {replica.url} refused the request: {failure}")
            with self._lock:
                replica.retries += 1
            if attempt < self.retries and status == _SERVER_ERROR:
                pause = resend_pause(attempt)
                logger.warning("trajectory %d: %s answered %s; sending it again in %g s (attempt %d of %d)", index,
                               replica.url, failure, pause, attempt + 2, self.retries + 1)
                if self._cancel.wait(pause):
                    raise RolloutError(f"trajectory {index}: the engine was closed while it waited to resend")
            elif attempt < self.retries:
                self._recover(replica, epoch, failure)
        raise RolloutError(f"trajectory {index}: {replica.url} failed {self.retries + 1} times; last error: {failure}")

    def _served_version(self, replica: Replica, completion: Completion, reply: HTTPReply) -> int | None:
        if self._lora:
            version = lora_version(completion.model, self._prefix)
            if version is None and completion.model == replica.base_model and not self._publications:
                return self._initial_version  # before the first publication the base model is the policy
            return version
        return reply.policy_version if reply.policy_version is not None else replica.version

    # -- replicas --------------------------------------------------------------------------------------------------
    def _new_batch(self) -> None:
        """start_batch, after its checks: a fresh routing table and fresh per-batch counters."""
        self._clear_routes()
        self._batch_started, self._ttfr = time.perf_counter(), None
        with self._lock:
            self._peak_in_flight = 0

    def _route(self, trajectory: int) -> Replica:
        """Sticky, least-loaded routing (call with the lock held)."""
        replica = self._sticky.get(trajectory)
        if replica is None:
            live = [r for r in self._replicas if r.dead is None] or self._replicas
            replica = min(live, key=lambda r: (r.in_flight, r.assigned, r.index))
            replica.assigned += 1
            self._sticky[trajectory] = replica
        return replica

    def _clear_routes(self) -> None:
        with self._lock:
            self._sticky.clear()
            for replica in self._replicas:
                replica.assigned = 0

    def _recover(self, replica: Replica, epoch: int, failure: str) -> None:
        """Wait until `replica` answers /health again and serves the engine's version; declare it dead otherwise."""
        with replica.recovery:
            replica.refuse_if_dead()
            if replica.epoch != epoch:
                return  # another request already waited for this restart
            try:
                health = bring_back(replica, self.restart_timeout, cancel=self._cancel, supervisor=self.supervisor,
                                    max_restarts=self.max_restarts, lock=self._lock)
                restore_version(replica.url, health, version=self._version, published=bool(self._publications),
                                lora=self._lora, publisher=self._publisher, rank=self.role.rank)
            except (RolloutError, OSError) as exc:  # OSError: the re-publication found no server
                if self._cancel.is_set:
                    raise RolloutError(f"the engine was closed while {replica.url} was recovering") from None
                replica.refuse_if_dead()  # another request learned meanwhile that its engine died
                self._declare_dead(replica, f"rollout replica {replica.url} failed ({failure}) and did not come "
                                            f"back serving policy version {self._version}: {exc}")
                raise RolloutError(replica.dead) from None
            replica.epoch += 1

    def _declare_dead(self, replica: Replica, reason: str, *, engine: bool = False) -> None:
        """No request is sent to `replica` again, the ones waiting for it stop waiting, and the engine is unusable."""
        cause = getattr(self.supervisor, "root_cause", None) if engine else None  # a server this process started
        cause = cause(replica.index) if cause is not None else None
        if cause:
            reason = f"{reason}. The first error in its log: {cause}"
        with self._lock:
            if replica.dead is None:
                replica.dead, replica.engine_died = reason, engine
            if self._failure is None:
                self._failure = replica.dead
                self._failure_type = DeadEngineError if replica.engine_died else RolloutError

    def _revive_exited(self) -> None:
        """Before a publication: restart the owned servers whose process died while no request was on them."""
        if self.supervisor is None:
            return
        for replica in self._replicas:
            if self.supervisor.exit_status(replica.index) is not None:
                self._recover(replica, replica.epoch, "its process exited between batches")

    def _check_usable(self) -> None:
        if self._closed:
            raise RolloutError("the engine is closed")
        if self._failure is not None:
            raise self._failure_type(f"the engine failed earlier; create a new one.\n{self._failure}")
