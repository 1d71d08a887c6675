"""`RankFailureGuard` in one process, with an in-memory store standing in for the job's TCP store: the failing
process posts and prints its cause, a later failure names the first, a peer's posted failure (or a store that is
gone) stops the main thread with `PeerProcessError`, and one process needs none of it."""

from __future__ import annotations

import threading
import time

import pytest
from torch.distributed import HashStore

from trl_thundersync.errors import PeerProcessError
from trl_thundersync.trainers.rank_failure import STORE_LOST_POLLS, RankFailureGuard


def guard(rank: int, store, exits: list | None = None, **kw) -> RankFailureGuard:
    return RankFailureGuard(rank, 2, 1800, step=lambda: 5, store=store, poll_s=0.02, grace_s=0.3,
                            hard_exit=(exits if exits is not None else []).append, **kw)


def test_one_process_is_left_alone(capsys):
    with pytest.raises(RuntimeError, match="boom"), RankFailureGuard(0, 1, 1800, step=lambda: 0):
        raise RuntimeError("boom")
    assert capsys.readouterr().err == ""


def test_failing_process_posts_and_prints_its_cause(capsys):
    store = HashStore()
    g = guard(1, store)
    with pytest.raises(RuntimeError, match="boom"), g:
        raise RuntimeError("boom\nsecond line")
    report = "rank 1 of 2 failed at optimizer step 5: RuntimeError: boom"
    assert store.get(g._key).decode() == report
    err = capsys.readouterr().err
    assert err.startswith(f"ThunderSync: {report}; the other processes stop within") and "ddp_timeout=1800" in err


def test_a_later_failure_names_the_first(capsys):
    store = HashStore()
    g = guard(0, store)
    first = "rank 1 of 2 failed at optimizer step 5: RewardFunctionError: reward server down"
    with pytest.raises(ConnectionError), g:
        store.set(g._key, first)  # posted by rank 1 (before rank 0's watcher looked)
        raise ConnectionError("Connection closed by peer")
    assert store.get(g._key).decode() == first  # the root cause stands
    assert f"rank 0 of 2 failed at optimizer step 5: ConnectionError: Connection closed by peer — after {first}" \
        in capsys.readouterr().err


def test_peer_failure_stops_the_main_thread_with_its_cause(capsys):
    store, exits = HashStore(), []
    g = guard(0, store, exits)
    cause = "rank 1 of 2 failed at optimizer step 5: RewardFunctionError: reward server down"
    started = time.monotonic()
    with pytest.raises(PeerProcessError, match=f"rank 0 of 2 stopped: {cause}"), g:
        threading.Timer(0.1, store.set, (g._key, cause)).start()
        time.sleep(30)  # a blocking call: the watcher's SIGINT ends it
    assert time.monotonic() - started < 5
    assert f"ThunderSync: rank 0 of 2 stops: {cause}" in capsys.readouterr().err
    time.sleep(0.6)
    assert exits == [1]  # a process still alive after the grace period is ended (here: recorded)


class GoneStore:
    """A store whose host has ended: every call fails."""

    def check(self, keys):
        raise ConnectionResetError("Connection reset by peer")


def test_a_store_that_is_gone_stops_the_process(capsys):
    exits = []
    started = time.monotonic()
    with pytest.raises(PeerProcessError, match="rendezvous store is unreachable"), guard(1, GoneStore(), exits):
        time.sleep(30)
    assert STORE_LOST_POLLS * 0.02 <= time.monotonic() - started < 5
    time.sleep(0.6)
    assert exits == [1]


def test_a_finished_run_stops_watching():
    store, exits = HashStore(), []
    g = guard(0, store, exits)
    with g:
        pass
    store.set(g._key, "rank 1 of 2 failed at optimizer step 5: RuntimeError: later")
    time.sleep(0.2)
    assert exits == [] and g.peer_failure is None


def test_the_stop_works_whatever_sigint_handler_a_library_left(capsys):
    """A library that ignores SIGINT (or only sets a flag) must not let a blocking call outlive the stop; the
    handler is put back afterwards."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        store = HashStore()
        g = guard(0, store, [])
        cause = "rank 1 of 2 failed at optimizer step 2: RuntimeError: boom"
        started = time.monotonic()
        with pytest.raises(PeerProcessError, match="rank 0 of 2 stopped"), g:
            threading.Timer(0.1, store.set, (g._key, cause)).start()
            time.sleep(30)
        assert time.monotonic() - started < 5
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
