"""The rollout-side contracts: what the learner needs from whatever produces trajectories (`RolloutEngine`), and what
the agent loop needs from whatever samples one turn (`TurnGenerator`).

`RolloutEngine` — lifecycle of one logical batch k (the learner never looks inside an engine):

1. `start_batch(requests, policy_version=k)`: every request is admitted at once; the engine keeps as many in flight
   as it can. Returns immediately.
2. `results()`: yields exactly `len(requests)` `Rollout` records *in completion order* (not index order), each as
   soon as it is finished, each stamped with the policy version that sampled it. Raises `RolloutError` if a
   trajectory cannot be produced; never yields a partial batch silently.
3. After the optimizer step: `publish(model, policy_version=k+1)` loads θ_{k+1} on every replica and returns only
   when all of them acknowledge serving it (paper Algorithm 1, line 27). Returns the publication time in seconds.
4. `close()` releases processes and servers; idempotent.

Optionally `step_metrics()`: flat `{name: value}` metrics the trainer appends to its logs once per logical batch
(`engine_step_metrics` reads them; an engine without the method reports none).

Implementations: `LocalProcessEngine` (embedded, CPU default), `TRLBatchEngine` (wraps TRL's own batch generation:
`rollout_func`), `VLLMServerEngine` (vLLM or embedded servers over HTTP), `AgentRolloutEngine` (multi-turn agent
loop over any `TurnGenerator`) and `TurnBatchEngine` (one request per trajectory over any `TurnGenerator`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

from ..types import Rollout, RolloutRequest


@runtime_checkable
class RolloutEngine(Protocol):
    def start_batch(self, requests: Sequence[RolloutRequest], policy_version: int) -> None: ...

    def results(self) -> Iterator[Rollout]: ...

    def publish(self, model: Any, policy_version: int) -> float: ...

    def close(self) -> None: ...

    def step_metrics(self) -> dict[str, float]:
        """Metrics of the latest logical batch for the trainer's logs (`rollout/...`); none by default."""
        return {}


@runtime_checkable
class TurnGenerator(Protocol):
    """Samples one generation request at a time: what the multi-turn agent loop drives, one request per turn.

    Implemented by `LocalProcessEngine`, `VLLMServerEngine` and `ScriptedTurnGenerator` (`benchmarks/scripted.py`);
    a trainer takes one through `trainer.use_turn_generator(generator)` (the agent loop wraps it when the trainer has
    tools or environments).

    Lifecycle:

    1. `policy_version`: the version it serves now (acknowledged by every replica). A batch at version k is only
       sampled from a generator serving k.
    2. `submit(request, key=..., max_new_tokens=...)`: queue one generation and return at once; the future resolves
       to a `Rollout` whose `completion_ids` are this request's new tokens (at most `max_new_tokens`, default the
       generator's own budget), stamped with the version that sampled them, or fails with `RolloutError`. `key` is
       unique among requests in flight (default `request.index`; the agent loop uses `(trajectory, turn)`); the
       same `request.seed` gives the same sample.
    3. `publish(model, policy_version)`: called only when nothing is in flight; loads the weights of `model`,
       returns once every replica serves `policy_version`, and the seconds it took.
    4. `close()`: aborts what is in flight and releases processes and servers; idempotent.

    Optionally `step_metrics()`, as for `RolloutEngine`.
    """

    @property
    def policy_version(self) -> int: ...

    def submit(self, request: RolloutRequest, *, key: Any = None, max_new_tokens: int | None = None) -> Future: ...

    def publish(self, model: Any, policy_version: int) -> float: ...

    def close(self) -> None: ...


def engine_step_metrics(engine: Any) -> dict[str, float]:
    """`engine.step_metrics()`, or no metrics for an engine (or generator) that does not report any."""
    report = getattr(engine, "step_metrics", None)
    return dict(report()) if callable(report) else {}
