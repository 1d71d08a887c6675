"""Sliding-window rate limiting: at most `limit` calls in any `window_s` seconds."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RateLimiter:
    def __init__(self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._calls: deque[float] = deque()

    def allow(self) -> bool:
        """Record a call and return True if it is within the limit; refused calls are not recorded.

        A call made at time t counts against every later call made before t + window_s.
        """
        now = self._clock()
        while self._calls and self._calls[0] < now - self.window_s:
            self._calls.popleft()
        if len(self._calls) > self.limit:
            return False
        self._calls.append(now)
        return True
