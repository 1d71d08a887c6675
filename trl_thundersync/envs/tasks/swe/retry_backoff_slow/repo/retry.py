"""Retrying flaky operations with capped exponential backoff."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def backoff_delays(base_s: float, factor: float, retries: int, cap_s: float) -> list[float]:
    """Delays before each retry: base, base*factor, base*factor^2, ..., each at most cap_s."""
    return [base_s * factor ** attempt for attempt in range(retries)]


def retry(operation: Callable[[], T], *, retries: int = 3, base_s: float = 0.1, factor: float = 2.0,
          cap_s: float = 1.0, retry_on: tuple[type[BaseException], ...] = (OSError,)) -> T:
    """Call `operation`; on an exception in `retry_on`, sleep and try again, at most `retries` more times.

    The last exception propagates when every attempt failed. Other exceptions propagate immediately.
    """
    delays = backoff_delays(base_s, factor, retries, cap_s)
    for delay in delays:
        try:
            return operation()
        except retry_on:
            time.sleep(delay)
    return operation()
