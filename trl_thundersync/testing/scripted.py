"""A scripted turn generator: deterministic agent actions without a trained model, for tests and benchmarks.

It has the interface the agent engine uses (`submit`, `publish`, `policy_version`, `close`). Each request's action
is `script(index, turn, context_text)` tokenized and closed with EOS, delivered after an optional per-request delay
on a small thread pool (so trajectories finish in a different order than they started). The learner recomputes
log-probabilities from the real model, so scripted actions exercise the whole training path exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..types import Rollout, RolloutRequest

ScriptFn = Callable[[int, int, str], str]  # (trajectory index, turn, decoded context) -> action text


class ScriptedTurnGenerator:
    def __init__(self, tokenizer, script: ScriptFn, *, delay: Callable[[int, int], float] | None = None,
                 policy_version: int = 0, workers: int = 8) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.delay = delay
        self.policy_version = policy_version
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scripted-generator")
        self.requests: list[tuple[Any, int]] = []  # (key, max_new_tokens) of every request, for assertions
        self.publications: list[int] = []

    def submit(self, request: RolloutRequest, *, key: Any = None, max_new_tokens: int | None = None) -> Future:
        self.requests.append((key, max_new_tokens or 0))
        version = self.policy_version
        return self.pool.submit(self._act, request, key, max_new_tokens, version)

    def _act(self, request: RolloutRequest, key: Any, max_new_tokens: int | None, version: int) -> Rollout:
        turn = key[1] if isinstance(key, tuple) else 0
        if self.delay is not None:
            time.sleep(self.delay(request.index, turn))
        context = self.tokenizer.decode(list(request.prompt_ids))
        ids = self.tokenizer.encode(self.script(request.index, turn, context), add_special_tokens=False)
        ids = ids + [self.tokenizer.eos_token_id]
        if max_new_tokens is not None:
            ids = ids[:max_new_tokens]
        now = time.perf_counter()
        return Rollout(index=request.index, group=request.group, policy_version=version,
                       prompt_ids=request.prompt_ids, completion_ids=tuple(ids),
                       sampling_logprobs=tuple(0.0 for _ in ids), started_at=now, finished_at=now)

    def publish(self, model: Any, policy_version: int) -> float:
        self.policy_version = policy_version
        self.publications.append(policy_version)
        return 0.0

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def tool_call_text(name: str, arguments: dict) -> str:
    """An action calling one tool in the Qwen3 / Hermes format the tiny tokenizer's template parses."""
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'
