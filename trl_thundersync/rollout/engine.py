"""The rollout-engine contract: what the learner needs from whatever produces trajectories.

Lifecycle of one logical batch k (the learner never looks inside an engine):

1. `start_batch(requests, policy_version=k)`: every request is admitted at once; the engine keeps as many in flight
   as it can. Returns immediately.
2. `results()`: yields exactly `len(requests)` `Rollout` records *in completion order* (not index order), each as
   soon as it is finished, each stamped with the policy version that sampled it. Raises `RolloutError` if a
   trajectory cannot be produced; never yields a partial batch silently.
3. After the optimizer step: `publish(model, policy_version=k+1)` loads θ_{k+1} on every replica and returns only
   when all of them acknowledge serving it (paper Algorithm 1, line 27). Returns the publication time in seconds.
4. `close()` releases processes and servers; idempotent.

Implementations: `LocalProcessEngine` (embedded, CPU default), `TRLBatchEngine` (wraps TRL's own batch generation:
`rollout_func`), `VLLMServerEngine` (vLLM or embedded servers over HTTP) and `AgentRolloutEngine` (multi-turn
agent loop over either of the first and the third).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from ..types import Rollout, RolloutRequest


@runtime_checkable
class RolloutEngine(Protocol):
    def start_batch(self, requests: Sequence[RolloutRequest], policy_version: int) -> None: ...

    def results(self) -> Iterator[Rollout]: ...

    def publish(self, model: Any, policy_version: int) -> float: ...

    def close(self) -> None: ...
