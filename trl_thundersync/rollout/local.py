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

Timestamps: the worker stamps `time.monotonic()` (CLOCK_MONOTONIC, system-wide on Linux); the engine maps them onto
this process's `time.perf_counter()` clock with an offset measured at construction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import queue
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigurationError, RolloutError
from ..types import Rollout, RolloutRequest, SamplingParams
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


# ------------------------------------------------------------------------------------------------------------ worker


def _build_processors(sampling: SamplingParams) -> list[Any]:
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


class _Trajectory:
    """Decoding state of one request: its cache, generator and tokens so far."""

    def __init__(self, request: RolloutRequest) -> None:
        from transformers import DynamicCache

        self.request = request
        self.cache = DynamicCache()
        self.generator = torch.Generator().manual_seed(request.seed)
        self.tokens = list(request.prompt_ids)  # prompt + completion, for the repetition penalty
        self.next_input = torch.tensor([request.prompt_ids], dtype=torch.long)  # [1, T]: prompt, then one token
        self.logprobs: list[float] = []
        self.started = time.monotonic()


class _Worker:
    """The generation loop; identical in a spawned process and in a thread."""

    def __init__(self, config, layout: FlatLayout, buf, sampling: SamplingParams, max_in_flight, commands, results):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        self.params = self.model.state_dict()
        floats = {n for n, t in self.params.items() if t.is_floating_point()}
        unknown = sorted(floats ^ {name for name, _, _ in layout.entries})
        if unknown:
            raise RolloutError(f"policy weights and the worker model disagree on tensor names: {unknown[:5]}")
        # transformers renamed `past_key_values` to `cache`; pass whichever this version's forward takes
        self.cache_kwarg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self.layout, self.buf, self.sampling = layout, buf, sampling
        self.processors = _build_processors(sampling)
        self.eos = frozenset(sampling.eos_token_ids)
        self.max_in_flight, self.commands, self.results = max_in_flight, commands, results
        self.version = -1  # set by the first load
        self.pending: deque[RolloutRequest] = deque()
        self.active: list[_Trajectory] = []

    def load(self, version: int, extras: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in [*self.layout.views(self.buf), *extras.items()]:
                self.params[name].copy_(tensor)
            # Tied parameters share storage: two different published values for them cannot both be served.
            for name, tensor in self.layout.views(self.buf):
                if not torch.equal(self.params[name], tensor):
                    raise RolloutError(f"tensor {name!r} could not be loaded as published (tied to another tensor?)")
        self.version = version

    def run(self, alive) -> None:
        while True:
            busy = bool(self.active or self.pending)
            try:
                command = self.commands.get_nowait() if busy else self.commands.get(timeout=1.0)
            except queue.Empty:
                command = None
            if command is None:
                if busy:
                    self.tick()
                elif not alive():
                    return
            elif command[0] == "stop":
                return
            elif command[0] == "batch":
                self.pending.extend(command[1])
            elif command[0] == "publish":
                self.load(command[1], command[2])
                self.results.put(("published", command[1]))

    def tick(self) -> None:
        while self.pending and len(self.active) < self.max_in_flight:
            self.active.append(_Trajectory(self.pending.popleft()))
        still: list[_Trajectory] = []
        for traj in self.active:
            if self.step(traj):
                self.results.put(("rollout", self.finish(traj)))
            else:
                still.append(traj)
        self.active = still

    @torch.inference_mode()
    def step(self, traj: _Trajectory) -> bool:
        """Sample one token for `traj`; True when the trajectory is finished."""
        kwargs = {self.cache_kwarg: traj.cache}
        out = self.model(input_ids=traj.next_input, use_cache=True, logits_to_keep=1, **kwargs)
        scores = out.logits[:, -1, :].float()  # [1, V]
        seen = torch.tensor([traj.tokens], dtype=torch.long)
        for proc in self.processors:
            scores = proc(seen, scores)
        token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=traj.generator).item())
        traj.logprobs.append(float(torch.log_softmax(scores, dim=-1)[0, token]))
        traj.tokens.append(token)
        traj.next_input = torch.tensor([[token]], dtype=torch.long)
        n_new = len(traj.tokens) - len(traj.request.prompt_ids)
        return token in self.eos or n_new >= self.sampling.max_new_tokens

    def finish(self, traj: _Trajectory) -> Rollout:
        req = traj.request
        return Rollout(
            index=req.index,
            group=req.group,
            policy_version=self.version,
            prompt_ids=tuple(req.prompt_ids),
            completion_ids=tuple(traj.tokens[len(req.prompt_ids) :]),
            sampling_logprobs=tuple(traj.logprobs),
            started_at=traj.started,  # time.monotonic(); mapped to the parent's perf_counter on receipt
            finished_at=time.monotonic(),
        )


def _worker_main(config, layout, buf, extras, sampling, max_in_flight, commands, results, version, num_threads):
    """Worker entry (process or thread): reports ("ready", v), then serves; ("error", traceback) on any failure."""
    try:
        if num_threads is not None:  # process mode only: thread mode must not change the learner's settings
            torch.set_num_threads(num_threads)
        worker = _Worker(config, layout, buf, sampling, max_in_flight, commands, results)
        worker.load(version, extras)
        results.put(("ready", version))
        if num_threads is None:
            worker.run(alive=threading.main_thread().is_alive)
        else:
            import multiprocessing

            parent = multiprocessing.parent_process()
            worker.run(alive=lambda: parent is None or parent.is_alive())
    except BaseException:  # the parent raises RolloutError with this text
        results.put(("error", traceback.format_exc()))


# ------------------------------------------------------------------------------------------------------------ parent


@contextlib.contextmanager
def _main_importable():
    """Spawned children re-import `__main__` from its file; `python -` and some REPLs name a file that does not
    exist ('<stdin>'). Hide such a name while the child starts, so the worker runs from any entry point."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    hide = path is not None and not os.path.exists(path)
    if hide:
        del main.__file__
    try:
        yield
    finally:
        if hide:
            main.__file__ = path


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
    """Embedded rollout engine implementing `RolloutEngine` (lifecycle in `engine.py`)."""

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
        self._open: int | None = None  # rollouts still owed by results() for the open batch
        self._failure: str | None = None
        self._batch_started = self._gen_seconds = self._last_pub = 0.0
        self._counts = {"trajectories": 0, "tokens": 0, "publications": 0}
        self._receive("ready", timeout=start_timeout, what="start")

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
        with _main_importable():
            runner.start()
        return _Handle(runner, commands, results)

    def start_batch(self, requests: Sequence[RolloutRequest], policy_version: int) -> None:
        self._check_usable()
        if self._open is not None:
            raise RolloutError(f"a batch is still open ({self._open} rollouts not yet consumed by results())")
        if policy_version != self._version:
            raise RolloutError(
                f"start_batch(policy_version={policy_version}) but the worker serves version {self._version}; "
                "publish(model, policy_version) first"
            )
        indices = [r.index for r in requests]
        if len(set(indices)) != len(indices) or any(len(r.prompt_ids) == 0 for r in requests):
            raise RolloutError("requests must have distinct indices and non-empty prompt_ids")
        self._batch_started = time.perf_counter()
        self._open = len(requests)
        if requests:
            self._handle.commands.put(("batch", list(requests)))

    def results(self) -> Iterator[Rollout]:
        if self._open is None:
            raise RolloutError("results() called without an open batch; call start_batch first")
        while self._open:
            rollout = self._receive("rollout", timeout=None, what="generation")
            rollout = dataclasses.replace(
                rollout,
                started_at=rollout.started_at + self._clock_offset,
                finished_at=rollout.finished_at + self._clock_offset,
            )
            self._open -= 1
            self._counts["trajectories"] += 1
            self._counts["tokens"] += len(rollout.completion_ids)
            yield rollout
        self._gen_seconds += time.perf_counter() - self._batch_started
        self._open = None

    def publish(self, model: Any, policy_version: int) -> float:
        self._check_usable()
        if self._open is not None:
            raise RolloutError(f"cannot publish while a batch is open ({self._open} rollouts not yet consumed)")
        start = time.perf_counter()
        extras = self._layout.pack(policy_state_dict(model), self._buf)
        self._handle.commands.put(("publish", policy_version, extras))
        acked = self._receive("published", timeout=self.start_timeout, what="publish")
        if acked != policy_version:
            self._fail("publish", f"worker acknowledged version {acked} instead of {policy_version}")
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

    @property
    def worker_pid(self) -> int | None:
        """Process id of the worker (None in thread mode)."""
        return getattr(self._handle.runner, "pid", None)

    def stats(self) -> EngineStats:
        """Counters since construction (see `EngineStats`)."""
        return EngineStats(
            generation_seconds=self._gen_seconds, last_publication_seconds=self._last_pub, **self._counts
        )

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise RolloutError(f"the rollout worker failed earlier; create a new engine.\n{self._failure}")
        if not self._finalizer.alive:
            raise RolloutError("the engine is closed")

    def _receive(self, kind: str, timeout: float | None, what: str) -> Any:
        """Next message of `kind` from the worker; RolloutError if the worker reports an error, dies or times out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                message = self._handle.results.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._handle.runner.is_alive():  # one last look: its error report may have just landed
                    try:
                        message = self._handle.results.get(timeout=_POLL_S)
                    except queue.Empty:
                        self._fail(what, self._handle.exit_text())
                elif deadline is not None and time.monotonic() > deadline:
                    self._fail(what, f"no answer from the worker within {timeout:.0f} s")
                else:
                    continue
            if message[0] == "error":
                self._fail(what, message[1])
            if message[0] != kind:
                self._fail(what, f"protocol error: expected {kind!r}, got {message[0]!r}")
            return message[1]

    def _fail(self, what: str, detail: str) -> None:
        lost = self._open or 0
        self._failure = detail
        self._finalizer()
        message = f"rollout worker failed during {what}; {lost} trajectories of the open batch lost:\n{detail}"
        raise RolloutError(message) from None
