"""A teacher behind a vLLM-compatible HTTP server: sampled-token log-probabilities of each turn in its context.

One `POST {url}/v1/completions` per turn (or, with `teacher_scoring="trajectory"`, per trajectory: `score_spans`
reads every turn's action from one answer, `distill.teacher_schedule`) with the token ids of context + action as the
prompt, `max_tokens: 1` and `prompt_logprobs: 0` (`rollout.vllm_api.prompt_logprobs_payload`); vLLM answers
`choices[0].prompt_logprobs`, one entry per prompt token (the first is null), each a mapping from token id to
`{"logprob", "rank", "decoded_token"}` that contains at least the prompt token itself. An action's entries are
those of its positions. Enough for the OPD objective;
the generalized JSD needs a local teacher (`full_vocabulary = False`). The embedded server
(`python -m trl_thundersync.serve`) answers the same way, so it can serve the teacher too.

HTTP goes through the rollout client's wire helpers (`rollout.vllm_api.http_call`: plain `http.client`, one
connection per request, the `timeout` per request; a transient failure — no answer, HTTP 500/502/503 — is resent on
TRL's client's schedule, `retries` times at most); every failure — no answer, an HTTP error (with the server's
message, in any of vLLM's error shapes), a malformed answer — is a `TeacherScoringError` naming the server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import RolloutError, TeacherScoringError, VocabularyMismatchError
from ..rollout.vllm_api import (
    engine_dead,
    error_message,
    http_call,
    parse_model_ids,
    prompt_logprobs_payload,
    resend_pause,
)
from .records import TeacherScores
from .vocab_map import VocabularyMap

logger = logging.getLogger(__name__)

_TRANSIENT = (500, 502, 503)  # resent, as TRL's client's Retry(status_forcelist=[500, 502, 503]) does


class ServerTeacher:
    """`TeacherScorer` over HTTP (see the module docstring); `close()` has nothing to release."""

    full_vocabulary = False

    def __init__(self, url: str, model: str | None = None, timeout: float = 120.0,
                 vocab_map: VocabularyMap | None = None, tokenizer: Any = None, retries: int = 3) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout  # seconds per request
        self.retries = retries  # resends of one request after a transient failure (`_request`)
        self.model = model or self._first_model()
        self.vocab_map = vocab_map  # student ids are sent (and looked up) as the teacher's ids
        if tokenizer is not None and vocab_map is None:  # ids go as they are: the teacher must split text the same
            from ..rollout.server_info import check_server_tokenizer

            try:
                check_server_tokenizer(self.url, self.model, tokenizer, role="teacher server", timeout=timeout,
                                       error=VocabularyMismatchError)
            except OSError as exc:
                raise TeacherScoringError(f"teacher server {self.url}/tokenize: {type(exc).__name__}: {exc}") from exc

    def score(self, context_ids: Sequence[int], action_ids: Sequence[int]) -> TeacherScores:
        if not action_ids:
            return TeacherScores(torch.zeros(0))
        start = len(context_ids)
        return self.score_spans(list(context_ids) + list(action_ids), [(start, start + len(action_ids))])[0]

    def score_spans(self, ids: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[TeacherScores]:
        """One request over `ids`; the log-probs of each action span [start, end) (`teacher_schedule`)."""
        if self.vocab_map is not None:
            ids = self.vocab_map.to_teacher(ids)
        prompt = [int(t) for t in ids]
        answer = self._request("POST", "/v1/completions", prompt_logprobs_payload(self.model, prompt))
        entries = self._prompt_logprobs(answer, len(prompt))
        return [TeacherScores(torch.tensor(self._span_logprobs(entries, prompt, start, end), dtype=torch.float32))
                for start, end in spans]

    def close(self) -> None:
        return None

    def _prompt_logprobs(self, answer: Any, length: int) -> list:
        """`choices[0].prompt_logprobs` of an answer (one entry per prompt token); refuses a malformed one."""
        try:
            entries = answer["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError) as exc:
            raise TeacherScoringError(
                f"teacher server {self.url}: the answer has no choices[0].prompt_logprobs ({type(exc).__name__}: "
                f"{exc}); the server must support vLLM's prompt_logprobs") from exc
        if not isinstance(entries, list) or len(entries) < length:
            got = len(entries) if isinstance(entries, list) else type(entries).__name__
            raise TeacherScoringError(
                f"teacher server {self.url}: returned {got} prompt log-probabilities for {length} prompt tokens")
        return entries

    def _span_logprobs(self, entries: list, prompt: list[int], start: int, end: int) -> list[float]:
        """The log-probs of prompt[start:end] (one action) among the prompt entries."""
        values = []
        for position in range(start, end):
            entry = entries[position]
            scored = entry.get(str(prompt[position])) if isinstance(entry, dict) else None
            if not isinstance(scored, dict) or "logprob" not in scored:
                raise TeacherScoringError(
                    f"teacher server {self.url}: no log-probability for action token {prompt[position]} at prompt "
                    f"position {position}")
            values.append(float(scored["logprob"]))
        return values

    def _first_model(self) -> str:
        answer = self._request("GET", "/v1/models", None)
        try:
            return parse_model_ids(answer)[0]
        except (RolloutError, IndexError, KeyError, TypeError) as exc:
            raise TeacherScoringError(f"teacher server {self.url}: /v1/models lists no model; pass the model name"
                                      ) from exc

    def _request(self, method: str, path: str, body: dict | None) -> Any:
        """One call, resent on a transient failure (no answer, HTTP 500/502/503) up to `retries` times on TRL's
        client's schedule (at once, then after 4, 8, ... s): scoring has no side effects, so resending is safe. A
        timeout is not resent (the request may still be running there)."""
        failure = ""
        for attempt in range(self.retries + 1):
            if attempt:
                logger.warning("teacher server %s%s: %s; sending it again (attempt %d of %d)", self.url, path,
                               failure, attempt + 1, self.retries + 1)
                time.sleep(resend_pause(attempt - 1))
            try:
                reply = http_call(self.url, method, path, body, timeout=self.timeout)
            except TimeoutError as exc:
                raise TeacherScoringError(f"teacher server {self.url}{path}: no answer within {self.timeout:g} s "
                                          "(teacher_server_timeout)") from exc
            except OSError as exc:  # refused, reset: no HTTP answer
                failure = f"{type(exc).__name__}: {exc}"
                continue
            if reply.status == 200:
                try:
                    return reply.json()
                except ValueError as exc:
                    raise TeacherScoringError(f"teacher server {self.url}{path}: the answer is not JSON: {exc}"
                                              ) from exc
            failure = f"HTTP {reply.status}: {error_message(reply)}"
            if engine_dead(reply):  # vLLM's engine died: the server is about to exit, resending cannot help
                raise TeacherScoringError(f"teacher server {self.url}{path}: vLLM's engine died ({failure}); vLLM "
                                          "does not restart a dead engine and the server exits: the root cause is "
                                          "the first error in the server's log. Fix it, restart the server and the run")
            if reply.status not in _TRANSIENT:
                raise TeacherScoringError(f"teacher server {self.url}{path}: {failure}")
        tries = f" (sent {self.retries + 1} times)" if self.retries else ""
        raise TeacherScoringError(f"teacher server {self.url}{path}: {failure}{tries}")
