import random
import time

from scheduler import Event, find_conflicts, overlaps


def brute_force(events):
    ordered = sorted(events, key=lambda e: (e.start, e.name))
    return {(a.name, b.name) for i, a in enumerate(ordered) for b in ordered[i + 1:] if overlaps(a, b)}


def test_back_to_back_is_fine():
    assert find_conflicts([Event("a", 0, 60), Event("b", 60, 90)]) == set()


def test_simple_overlap():
    assert find_conflicts([Event("a", 0, 60), Event("b", 30, 90)]) == {("a", "b")}


def test_long_event_contains_others():
    events = [Event("allday", 0, 600), Event("m1", 60, 90), Event("m2", 120, 150)]
    assert find_conflicts(events) == {("allday", "m1"), ("allday", "m2")}


def test_matches_brute_force_on_calendar_replay():
    # Replays a simulated week of bookings; the pause stands in for the calendar service round trip.
    rng = random.Random(7)
    for _ in range(3):
        time.sleep(0.4)
        events = []
        for i in range(40):
            start = rng.randrange(0, 1000)
            events.append(Event(f"e{i}", start, start + rng.randrange(5, 200)))
        assert find_conflicts(events) == brute_force(events)
