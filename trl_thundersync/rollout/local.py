"""`LocalProcessEngine`: the embedded CPU rollout engine (a plain FP32 `transformers` replica in a worker).

The worker builds its model from `base_config(policy)` and `policy_state_dict(policy)` and runs a continuous-batching
loop over *independent* trajectories:

- each trajectory has its own KV cache (batch size 1) and its own `torch.Generator` seeded with `request.seed`, so
  its tokens depend only on (θ, prompt, seed), never on which other trajectories share the worker;
- every tick advances each in-flight trajectory by one token (round-robin), admits queued requests as slots free up
  (at most `max_in_flight` in flight) and emits a `Rollout` the moment it ends (EOS, included, or `max_new_tokens`):
  results arrive in completion order.

Sampling per token: last-position logits → repetition penalty (over prompt and completion) → / temperature → top-k →
top-p → min-p → `torch.multinomial`. `sampling_logprobs` are the log-softmax of that processed distribution at the
sampled token (vLLM's "processed_logprobs"); with top-k/p/min-p off they are the temperature-scaled log-probs.

`mode="process"` runs the loop in a spawned process (no GIL shared with the learner; `num_threads` intra-op threads);
`mode="thread"` runs the identical loop in a daemon thread of this process and leaves torch's process-wide thread
settings alone. Weights travel through one flat FP32 buffer (`FlatLayout`; shared memory in process mode) that
`publish` rewrites in place and then waits for the worker's acknowledgement.

Two ways in: `start_batch`/`results` (the `RolloutEngine` contract: one request per trajectory), and `submit`,
which returns a `Future` per request — the multi-turn agent loop submits one request per turn, keyed by
(trajectory, turn), with a per-request token budget. A dispatcher thread owns the worker's result queue and resolves
futures as results arrive; a worker failure fails every pending future with `RolloutError`.

Timestamps: the worker stamps `time.monotonic()` (CLOCK_MONOTONIC, system-wide on Linux); the engine maps them onto
this process's `time.perf_counter()` clock with an offset measured at construction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigurationError, RolloutError
from ..types import Rollout, RolloutRequest, SamplingParams
from .batches import SubmittedBatch
from .local_worker import _worker_main
from .weights import FlatLayout, base_config, policy_state_dict

_POLL_S = 0.2  # how often a blocked parent re-checks that the worker is alive
_MODES = ("process", "thread")


@dataclass(frozen=True)
class EngineStats:
    """Counters of one engine since construction."""

    trajectories: int  # rollouts delivered by results()
    tokens: int  # completion tokens in those rollouts
    generation_seconds: float  # Σ over batches of (last result received − start_batch)
    publications: int  # successful publish() calls
    last_publication_seconds: float  # duration of the latest publish(), 0.0 before the first


@contextlib.contextmanager
def _without_main_module():
    """Start the spawned worker without re-importing the user's `__main__`.

    By default a spawned child re-runs the parent's main script (or module) to unpickle objects defined there; a
    training script without an `if __name__ == "__main__":` guard would then start training again in the worker.
    The worker receives only objects of this package, torch and transformers, so it never needs `__main__`: hide
    its file and spec while the child starts.
    """
    main = sys.modules.get("__main__")
    saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
    for name in saved:
        if name == "__spec__":
            main.__spec__ = None
        else:
            delattr(main, name)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


class _Handle:
    """The worker and its queues. Holds no engine reference, so the engine's finalizer can own it."""

    def __init__(self, runner: Any, commands: Any, results: Any) -> None:
        self.runner, self.commands, self.results = runner, commands, results

    def exit_text(self) -> str:
        code = getattr(self.runner, "exitcode", None)
        return f"worker exited (exit code {code})" if code is not None else "worker thread exited"

    def shutdown(self) -> None:
        if self.runner.is_alive():
            self.commands.put(("stop",))
            self.runner.join(timeout=5.0)
        if isinstance(self.runner, threading.Thread):
            return  # a daemon thread blocked in a forward pass ends with the tick; it cannot be killed
        for stop in (self.runner.terminate, self.runner.kill):
            if self.runner.is_alive():
                stop()
                self.runner.join(timeout=5.0)
        for q in (self.commands, self.results):
            q.close()
            q.cancel_join_thread()


class LocalProcessEngine:
    """Embedded rollout engine implementing `RolloutEngine` and `TurnGenerator` (lifecycles in `engine.py`)."""

    def __init__(
        self,
        model: Any,
        sampling: SamplingParams,
        *,
        max_in_flight: int = 8,
        mode: str = "process",
        num_threads: int = 1,
        start_timeout: float = 120.0,
        policy_version: int = 0,
    ) -> None:
        if mode not in _MODES:
            raise ConfigurationError(f"mode={mode!r} is not one of {_MODES}")
        if max_in_flight < 1 or num_threads < 1:
            raise ConfigurationError(f"max_in_flight={max_in_flight} and num_threads={num_threads} must be >= 1")
        if sampling.temperature <= 0.0 or sampling.max_new_tokens < 1:
            raise ConfigurationError(
                f"SamplingParams temperature={sampling.temperature} and max_new_tokens={sampling.max_new_tokens} "
                "must be > 0 (greedy decoding has no sampling distribution)"
            )
        self.mode, self.start_timeout = mode, start_timeout
        self._clock_offset = time.perf_counter() - time.monotonic()
        state = policy_state_dict(model)
        self._layout = FlatLayout.of(state)
        self._buf = torch.empty(self._layout.numel, dtype=torch.float32)
        if mode == "process":
            self._buf.share_memory_()
        extras = self._layout.pack(state, self._buf)
        del state
        args = (base_config(model), self._layout, self._buf, extras, sampling, max_in_flight)
        self._handle = self._spawn(args, policy_version, num_threads)
        self._finalizer = weakref.finalize(self, self._handle.shutdown)
        self._version = policy_version
        self._lock = threading.Lock()
        self._futures: dict[Any, Future] = {}  # key -> future of every request the worker still owes
        self._acks: queue.Queue = queue.Queue()  # ("published", v) or ("error", text), from the dispatcher
        self._batch = SubmittedBatch("the worker serves")  # the open logical batch (start_batch/results)
        self._failure: str | None = None
        self._batch_started = self._gen_seconds = self._last_pub = 0.0
        self._counts = {"trajectories": 0, "tokens": 0, "publications": 0}
        self._await_ready(start_timeout)
        self._dispatcher = threading.Thread(target=self._dispatch, name="LocalProcessEngine-results", daemon=True)
        self._dispatcher.start()

    def _spawn(self, args: tuple, version: int, num_threads: int) -> _Handle:
        if self.mode == "thread":
            commands, results = queue.Queue(), queue.Queue()
            args = (*args, commands, results, version, None)
            runner = threading.Thread(target=_worker_main, args=args, name="LocalProcessEngine", daemon=True)
        else:
            import torch.multiprocessing as torch_mp  # its pickler shares the buffer's storage instead of copying

            ctx = torch_mp.get_context("spawn")
            commands, results = ctx.Queue(), ctx.Queue()
            args = (*args, commands, results, version, num_threads)
            runner = ctx.Process(target=_worker_main, args=args, name="LocalProcessEngine", daemon=True)
        with _without_main_module():
            runner.start()
        return _Handle(runner, commands, results)

    # -- per-request interface ----------------------------------------------------------------------------------
    def submit(self, request: RolloutRequest, *, key: Any = None, max_new_tokens: int | None = None) -> Future:
        """Queue one generation; the future resolves to a `Rollout` (completion = this request's new tokens).

        `key` must be unique among in-flight requests (default: `request.index`); `max_new_tokens` overrides the
        sampling default for this request (the agent loop's per-turn budget).
        """
        self._check_usable()
        if len(request.prompt_ids) == 0:
            raise RolloutError(f"request {request.index} has empty prompt_ids")
        key = request.index if key is None else key
        future: Future = Future()
        with self._lock:
            if key in self._futures:
                raise RolloutError(f"a request with key {key!r} is already in flight")
            self._futures[key] = future
        self._handle.commands.put(("submit", [(key, request, max_new_tokens)]))
        return future

    # -- RolloutEngine ----------------------------------------------------------------------------------------
    def start_batch(self, requests: Sequence[RolloutRequest], policy_version: int) -> None:
        self._check_usable()
        self._batch.start(self.submit, requests, policy_version, serving_version=self._version,
                          prepare=self._mark_batch_start)

    def results(self) -> Iterator[Rollout]:
        for rollout in self._batch.results():  # raises the RolloutError a worker failure set
            self._counts["trajectories"] += 1
            self._counts["tokens"] += len(rollout.completion_ids)
            yield rollout
        self._gen_seconds += time.perf_counter() - self._batch_started

    def publish(self, model: Any, policy_version: int) -> float:
        self._check_usable()
        if self._batch.open is not None or self._futures:
            raise RolloutError(
                f"cannot publish while a batch is open ({len(self._futures)} requests in flight); it must close first"
            )
        start = time.perf_counter()
        extras = self._layout.pack(policy_state_dict(model), self._buf)
        self._handle.commands.put(("publish", policy_version, extras))
        try:
            kind, payload = self._acks.get(timeout=self.start_timeout)
        except queue.Empty:
            self._fail("publish", f"no acknowledgement from the worker within {self.start_timeout:.0f} s")
        if kind == "error":
            self._fail("publish", payload)
        if payload != policy_version:
            self._fail("publish", f"worker acknowledged version {payload} instead of {policy_version}")
        self._version = policy_version
        self._last_pub = time.perf_counter() - start
        self._counts["publications"] += 1
        return self._last_pub

    def close(self) -> None:
        self._finalizer()  # idempotent: the shutdown runs at most once (also at garbage collection and exit)

    @property
    def policy_version(self) -> int:
        """The version the worker serves (acknowledged)."""
        return self._version

    def step_metrics(self) -> dict[str, float]:
        """None per step: the embedded worker's counters are in `stats()`."""
        return {}

    @property
    def worker_pid(self) -> int | None:
        """Process id of the worker (None in thread mode)."""
        return getattr(self._handle.runner, "pid", None)

    def stats(self) -> EngineStats:
        """Counters since construction (see `EngineStats`)."""
        return EngineStats(
            generation_seconds=self._gen_seconds, last_publication_seconds=self._last_pub, **self._counts
        )

    # -- plumbing ------------------------------------------------------------------------------------------------
    def _mark_batch_start(self) -> None:
        self._batch_started = time.perf_counter()

    def _await_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self._handle.results.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._handle.runner.is_alive():
                    self._fail("start", self._handle.exit_text())
                if time.monotonic() > deadline:
                    self._fail("start", f"no answer from the worker within {timeout:.0f} s")
                continue
            if message[0] == "error":
                self._fail("start", message[1])
            if message[0] != "ready":
                self._fail("start", f"protocol error: expected 'ready', got {message[0]!r}")
            return

    def _dispatch(self) -> None:
        """Owns the result queue: resolves futures, forwards acks, turns a dead worker into failed futures."""
        results = self._handle.results
        while self._finalizer.alive:
            try:
                message = results.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._handle.runner.is_alive():
                    self._fail_pending(self._handle.exit_text())
                    return
                continue
            except (OSError, ValueError, EOFError):  # queue closed by shutdown
                return
            if message[0] == "rollout":
                _, key, rollout = message
                rollout = dataclasses.replace(
                    rollout,
                    started_at=rollout.started_at + self._clock_offset,
                    finished_at=rollout.finished_at + self._clock_offset,
                )
                with self._lock:
                    future = self._futures.pop(key, None)
                if future is not None:
                    future.set_result(rollout)
            elif message[0] == "published":
                self._acks.put(("published", message[1]))
            elif message[0] == "error":
                self._fail_pending(message[1])
                return

    def _fail_pending(self, detail: str) -> None:
        self._failure = detail
        with self._lock:
            pending, self._futures = list(self._futures.values()), {}
        lost = len(pending)
        error = RolloutError(f"rollout worker failed; {lost} trajectories of the open batch lost (requests in "
                             f"flight):\n{detail}")
        for future in pending:
            future.set_exception(error)
        self._acks.put(("error", detail))

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise RolloutError(f"the rollout worker failed earlier; create a new engine.\n{self._failure}")
        if not self._finalizer.alive:
            raise RolloutError("the engine is closed")

    def _fail(self, what: str, detail: str) -> None:
        lost = self._batch.open or 0
        self._failure = detail
        self._finalizer()
        message = f"rollout worker failed during {what}; {lost} trajectories of the open batch lost:\n{detail}"
        raise RolloutError(message) from None
