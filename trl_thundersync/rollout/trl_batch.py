"""`TRLBatchEngine`: TRL's own batch generation behind the `RolloutEngine` contract.

Used for what TRL generates itself — `rollout_func`, `tools`, `environment_factory` — so those keep TRL's exact
semantics. The whole batch arrives at once (TRL's contract is batch-synchronous); the learner still streams the
per-trajectory backward while later trajectories are being scored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import RolloutError
from ..types import Rollout, RolloutRequest

# prompts -> (prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images):
# the return value of `trl.GRPOTrainer._generate`.
BatchGenerateFn = Callable[[list[Any]], tuple]


class TRLBatchEngine:
    def __init__(self, generate: BatchGenerateFn, policy_version: int = 0) -> None:
        self._generate = generate
        self.policy_version = policy_version
        self._requests: Sequence[RolloutRequest] | None = None

    def start_batch(self, requests: Sequence[RolloutRequest], policy_version: int) -> None:
        if policy_version != self.policy_version:
            raise RolloutError(f"engine serves version {self.policy_version}, batch asks for {policy_version}")
        if self._requests is not None:
            raise RolloutError("a batch is still open")
        self._requests = list(requests)

    def results(self) -> Iterator[Rollout]:
        requests, self._requests = self._requests, None
        if requests is None:
            raise RolloutError("results() called without start_batch()")
        started = time.perf_counter()
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra, _, _ = self._generate(
            [r.prompt for r in requests]
        )
        if len(completion_ids) != len(requests):
            raise RolloutError(f"generation returned {len(completion_ids)} completions for {len(requests)} prompts")
        finished = time.perf_counter()
        for i, request in enumerate(requests):
            fields = {k: (v[i] if isinstance(v, list) else v) for k, v in (extra or {}).items()}
            yield Rollout(
                index=request.index,
                group=request.group,
                policy_version=self.policy_version,
                prompt_ids=tuple(prompt_ids[i]),
                completion_ids=tuple(completion_ids[i]),
                env_mask=tuple(tool_mask[i]) if tool_mask is not None else None,
                sampling_logprobs=tuple(logprobs[i]) if logprobs is not None and logprobs[i] is not None else None,
                completion=completions[i],
                extra_fields=fields,
                started_at=started,
                finished_at=finished,
            )

    def publish(self, model: Any, policy_version: int) -> float:
        # TRL's generation reads the live model (or syncs vLLM lazily itself): nothing to ship.
        self.policy_version = policy_version
        return 0.0

    def close(self) -> None:
        self._requests = None

    def step_metrics(self) -> dict[str, float]:
        """None: TRL's generation logs its own."""
        return {}
