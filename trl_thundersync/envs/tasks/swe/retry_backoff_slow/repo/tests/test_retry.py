import time

import pytest

from retry import backoff_delays, retry


class Flaky:
    def __init__(self, failures, exc=OSError):
        self.failures = failures
        self.exc = exc
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc("flaky")
        return "ok"


def test_delays_grow():
    assert backoff_delays(0.1, 2, 3, 10) == pytest.approx([0.1, 0.2, 0.4])


def test_delays_are_capped():
    assert backoff_delays(0.5, 3, 4, 2.0) == pytest.approx([0.5, 1.5, 2.0, 2.0])


def test_succeeds_after_failures():
    op = Flaky(2)
    assert retry(op, retries=3, base_s=0.2, factor=2.0, cap_s=1.0) == "ok"
    assert op.calls == 3


def test_gives_up():
    op = Flaky(10)
    with pytest.raises(OSError):
        retry(op, retries=2, base_s=0.1, factor=1.0, cap_s=1.0)
    assert op.calls == 3


def test_other_errors_not_retried():
    op = Flaky(1, exc=KeyError)
    with pytest.raises(KeyError):
        retry(op)
    assert op.calls == 1


def test_total_wait_respects_cap():
    op = Flaky(2)
    start = time.monotonic()
    retry(op, retries=3, base_s=0.2, factor=8.0, cap_s=0.3)  # uncapped, the second wait alone is 1.6 s
    assert time.monotonic() - start < 1.2
