"""`start_batch`/`results` over any per-request `submit`: the `RolloutEngine` half every `TurnGenerator` shares.

    batch = SubmittedBatch("the worker serves")
    batch.start(self.submit, requests, policy_version, serving_version=self.policy_version)
    for rollout in batch.results(): ...          # completion order, exactly len(requests) of them

`SubmittedBatch` holds one open logical batch and the checks the engines make on it: one batch open at a time, the
batch at the version the generator serves, distinct trajectory indices and non-empty prompts. Every request is
submitted at once; futures are handed out as they complete. A batch that failed (a future raised, the engine was
closed) or was abandoned by its consumer is over: nothing partial is handed on. `LocalProcessEngine` and
`VLLMServerEngine` keep their counters around it; `TurnBatchEngine` is the plain `RolloutEngine` over any
`TurnGenerator` (one request per trajectory), for generators that only `submit`.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from ..errors import RolloutError
from ..types import Rollout, RolloutRequest
from .engine import RolloutEngine, TurnGenerator, engine_step_metrics

SubmitFn = Callable[[RolloutRequest], Future]  # one request -> the future of its Rollout


class SubmittedBatch:
    """The open logical batch of one engine (not thread-safe: the learner's thread starts and consumes it)."""

    def __init__(self, serves: str = "the generator serves") -> None:
        self._serves = serves  # who serves the version, for the refusal ("the worker serves", "the servers serve")
        self._done: queue.Queue | None = None  # completed futures, in completion order
        self._open: int | None = None  # rollouts still owed by results(); None: no batch open

    @property
    def open(self) -> int | None:
        """Rollouts still owed by `results()`, None when no batch is open."""
        return self._open

    def start(self, submit: SubmitFn, requests: Sequence[RolloutRequest], policy_version: int, *,
              serving_version: int, prepare: Callable[[], None] | None = None) -> None:
        """Check the batch, run `prepare()` (the engine's per-batch bookkeeping), then submit every request."""
        if self._open is not None:
            raise RolloutError(f"a batch is still open ({self._open} rollouts not yet consumed by results())")
        if policy_version != serving_version:
            raise RolloutError(f"start_batch(policy_version={policy_version}) but {self._serves} version "
                               f"{serving_version}; publish(model, policy_version) first")
        indices = [r.index for r in requests]
        if len(set(indices)) != len(indices) or any(len(r.prompt_ids) == 0 for r in requests):
            raise RolloutError("requests must have distinct indices and non-empty prompt_ids")
        if prepare is not None:
            prepare()
        done: queue.Queue = queue.Queue()
        self._open, self._done = len(requests), done
        try:
            for request in requests:
                submit(request).add_done_callback(done.put)
        except BaseException:
            self._open = self._done = None  # a refused submit: no batch is open that results() could wait for
            raise

    def results(self) -> Iterator[Rollout]:
        """The batch's rollouts in completion order; raises the first failure (the batch is then over)."""
        if self._open is None or self._done is None:
            raise RolloutError("results() called without an open batch; call start_batch first")
        try:
            while self._open:
                future = self._done.get()
                if future.cancelled():  # close() cancelled it before it was sent
                    raise RolloutError("the engine was closed while the batch was open")
                rollout = future.result()  # raises the RolloutError / StalePolicyError of a failed request
                self._open -= 1
                yield rollout
        finally:
            self._open = self._done = None


class TurnBatchEngine:
    """`RolloutEngine` over any `TurnGenerator`: each request of a batch is one generation (lifecycle in
    `engine.py`). Publication and closing go to the generator, which this engine owns."""

    def __init__(self, generator: TurnGenerator) -> None:
        self.generator = generator
        self._batch = SubmittedBatch()

    @property
    def policy_version(self) -> int:
        return self.generator.policy_version

    def start_batch(self, requests: Sequence[RolloutRequest], policy_version: int) -> None:
        self._batch.start(self.generator.submit, requests, policy_version,
                          serving_version=self.generator.policy_version)

    def results(self) -> Iterator[Rollout]:
        return self._batch.results()

    def publish(self, model: Any, policy_version: int) -> float:
        if self._batch.open is not None:
            raise RolloutError(f"cannot publish while a batch is open ({self._batch.open} rollouts not yet "
                               "consumed by results()); it must close first")
        return self.generator.publish(model, policy_version)

    def close(self) -> None:
        self.generator.close()

    def step_metrics(self) -> dict[str, float]:
        return engine_step_metrics(self.generator)


def as_rollout_engine(generator: TurnGenerator | RolloutEngine) -> RolloutEngine:
    """`generator` itself when it also implements `start_batch`/`results`, else a `TurnBatchEngine` over it."""
    if callable(getattr(generator, "start_batch", None)) and callable(getattr(generator, "results", None)):
        return generator
    return TurnBatchEngine(generator)
