import time

from ratelimit import RateLimiter


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_first_calls_allowed():
    limiter = RateLimiter(2, 10, clock=FakeClock())
    assert limiter.allow() and limiter.allow()


def test_limit_is_exact():
    limiter = RateLimiter(3, 10, clock=FakeClock())
    assert [limiter.allow() for _ in range(5)] == [True, True, True, False, False]


def test_window_boundary_frees_slot():
    clock = FakeClock()
    limiter = RateLimiter(1, 10, clock=clock)
    assert limiter.allow()
    clock.now = 9.9
    assert not limiter.allow()
    clock.now = 10.0
    assert limiter.allow()


def test_real_clock_window():
    limiter = RateLimiter(2, 0.5)
    assert limiter.allow() and limiter.allow()
    assert not limiter.allow()
    time.sleep(0.6)
    assert limiter.allow()


def test_real_clock_sustained_rate():
    limiter = RateLimiter(5, 0.3)
    allowed = 0
    deadline = time.monotonic() + 0.95
    while time.monotonic() < deadline:
        allowed += limiter.allow()
        time.sleep(0.01)
    assert 5 <= allowed <= 20  # at most 4 windows start before the deadline
