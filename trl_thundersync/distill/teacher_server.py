"""A teacher behind a vLLM-compatible HTTP server: sampled-token log-probabilities of each turn in its context.

One `POST {url}/v1/completions` per turn with the token ids of context + action as the prompt, `max_tokens: 1` and
`prompt_logprobs: 0`; vLLM answers `choices[0].prompt_logprobs`, one entry per prompt token (the first is null), each
a mapping from token id to `{"logprob": …}` that contains at least the prompt token itself. The action's entries are
the last T. Enough for the OPD objective; the generalized JSD needs a local teacher (`full_vocabulary = False`).
Standard library only (urllib), so it adds no dependency.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence

import torch

from ..errors import TeacherScoringError
from .records import TeacherScores
from .vocab_map import VocabularyMap


class ServerTeacher:
    full_vocabulary = False

    def __init__(self, url: str, model: str | None = None, timeout: float = 120.0,
                 vocab_map: VocabularyMap | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.model = model or self._first_model()
        self.vocab_map = vocab_map  # student ids are sent (and looked up) as the teacher's ids

    def score(self, context_ids: Sequence[int], action_ids: Sequence[int]) -> TeacherScores:
        if not action_ids:
            return TeacherScores(torch.zeros(0))
        if self.vocab_map is not None:
            context_ids, action_ids = self.vocab_map.to_teacher(context_ids), self.vocab_map.to_teacher(action_ids)
        prompt = [int(t) for t in context_ids] + [int(t) for t in action_ids]
        body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        answer = self._request("/v1/completions", body)
        try:
            entries = answer["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError) as exc:
            raise TeacherScoringError(
                f"teacher server {self.url}: the answer has no choices[0].prompt_logprobs ({type(exc).__name__}: "
                f"{exc}); the server must support vLLM's prompt_logprobs") from exc
        if not isinstance(entries, list) or len(entries) < len(prompt):
            got = len(entries) if isinstance(entries, list) else type(entries).__name__
            raise TeacherScoringError(
                f"teacher server {self.url}: returned {got} prompt log-probabilities for {len(prompt)} prompt tokens "
                f"({len(action_ids)} action tokens to score)")
        values = []
        for position, token in enumerate(action_ids, start=len(context_ids)):
            entry = entries[position]
            scored = entry.get(str(int(token))) if isinstance(entry, dict) else None
            if not isinstance(scored, dict) or "logprob" not in scored:
                raise TeacherScoringError(
                    f"teacher server {self.url}: no log-probability for action token {token} at prompt position "
                    f"{position}")
            values.append(float(scored["logprob"]))
        return TeacherScores(torch.tensor(values, dtype=torch.float32))

    def close(self) -> None:
        return None

    def _first_model(self) -> str:
        answer = self._request("/v1/models", None)
        try:
            return answer["data"][0]["id"]
        except (KeyError, IndexError, TypeError) as exc:
            raise TeacherScoringError(f"teacher server {self.url}: /v1/models lists no model; pass the model name"
                                      ) from exc

    def _request(self, path: str, body: dict | None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method="POST" if body is not None else "GET",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise TeacherScoringError(f"teacher server {self.url}{path}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
            raise TeacherScoringError(f"teacher server {self.url}{path}: {type(exc).__name__}: {exc}") from exc
