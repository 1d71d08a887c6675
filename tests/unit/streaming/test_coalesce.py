"""Ready turns taken together (`streaming/coalesce.py`): which items merge, and the pipeline's drain with it."""

from __future__ import annotations

import queue
import threading

import pytest

from trl_thundersync.streaming.coalesce import CoalescedTurns, coalesce_turns, take_ready
from trl_thundersync.streaming.pipeline import DONE, drain
from trl_thundersync.types import Rollout, TurnEvent


def _turn(index: int, turn: int) -> TurnEvent:
    return TurnEvent(index, turn, 0, (1,) * (1 + 2 * turn), (2,), 0.0)


def _content(index: int) -> Rollout:
    return Rollout(index=index, group=0, policy_version=0, prompt_ids=(1,), completion_ids=(2,))


def test_consecutive_turns_of_one_trajectory_merge_at_the_first_place():
    items = [_turn(0, 0), _turn(1, 0), _turn(0, 1), _turn(0, 2), _content(1), _turn(1, 2), _turn(2, 0)]
    out = coalesce_turns(items)
    assert out[0] == CoalescedTurns((_turn(0, 0), _turn(0, 1), _turn(0, 2)))
    assert out[1] == _turn(1, 0)  # trajectory 1's turn 2 does not follow turn 0: kept apart
    assert out[2:] == [_content(1), _turn(1, 2), _turn(2, 0)]


def test_already_merged_turns_take_the_next_ones():
    merged = CoalescedTurns((_turn(0, 0), _turn(0, 1)))
    out = coalesce_turns([merged, _turn(1, 0), _turn(0, 2), CoalescedTurns((_turn(1, 1), _turn(1, 2)))])
    assert out == [CoalescedTurns((_turn(0, 0), _turn(0, 1), _turn(0, 2))),
                   CoalescedTurns((_turn(1, 0), _turn(1, 1), _turn(1, 2)))]


def test_a_turn_arriving_while_its_trajectorys_earlier_turn_waits_joins_it():
    """The learner is busy with trajectory 0's turn while trajectory 1's turn 0 waits; its turn 1 then arrives."""
    inbox: queue.Queue = queue.Queue()
    for item in (_turn(0, 0), _turn(1, 0)):
        inbox.put(item)
    seen: list = []

    def on_item(item):
        seen.append(item)
        if item == _turn(0, 0):  # arrives during the first hand-over
            inbox.put(_turn(1, 1))
            inbox.put(DONE)

    drain(inbox, threading.Event(), on_item, coalesce_turns)
    assert seen == [_turn(0, 0), CoalescedTurns((_turn(1, 0), _turn(1, 1)))]


def test_take_ready_stops_at_done_and_never_blocks():
    inbox: queue.Queue = queue.Queue()
    for item in (2, 3, DONE, 4):
        inbox.put(item)
    assert take_ready(inbox, [1], DONE) == [1, 2, 3, DONE]
    assert take_ready(inbox, [5], DONE) == [5, 4]  # (nothing left: returns at once)
    assert take_ready(inbox, [], DONE) == []


def test_drain_hands_coalesced_turns_to_the_learner_and_keeps_every_item():
    inbox: queue.Queue = queue.Queue()
    items = [_turn(0, 0), _turn(0, 1), _content(0), _turn(1, 0)]
    for item in [*items, DONE]:
        inbox.put(item)
    seen = []
    arrived = drain(inbox, threading.Event(), seen.append, coalesce_turns)
    assert arrived == items
    assert seen == [CoalescedTurns((_turn(0, 0), _turn(0, 1))), _content(0), _turn(1, 0)]
    inbox.put(_turn(0, 0))
    inbox.put(_turn(0, 1))
    inbox.put(DONE)
    assert drain(inbox, threading.Event(), seen.append) == [_turn(0, 0), _turn(0, 1)]  # without: one by one
    assert seen[-2:] == [_turn(0, 0), _turn(0, 1)]


def test_drain_raises_a_producer_failure_in_its_place():
    inbox: queue.Queue = queue.Queue()
    for item in (_turn(0, 0), RuntimeError("engine died"), _turn(0, 1), DONE):
        inbox.put(item)
    seen, stop = [], threading.Event()
    with pytest.raises(RuntimeError, match="engine died"):
        drain(inbox, stop, seen.append, coalesce_turns)
    assert seen == [_turn(0, 0)] and stop.is_set()
