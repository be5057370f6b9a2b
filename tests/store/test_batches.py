"""leases.store.batches: the threads of a process that send the same write at once share it."""

from __future__ import annotations

import threading
import time

import pymongo.errors
import pytest

from leases.store import batches
from tests.helpers import wait_for


def pending(kind) -> int:
    with batches._lock:
        return sum(len(batch.items) for batch in batches._open.get(kind, ()))


def run_together(kind, ids, send):
    """Each id combined from a thread of its own; returns id → result or the error raised."""
    out: dict = {}

    def one(item_id):
        try:
            out[item_id] = batches.combine(kind, item_id, f"item {item_id}", send)
        except pymongo.errors.PyMongoError as exc:
            out[item_id] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    return threads, out


def first_held(answer):
    """A send that records each batch's ids (in arrival order) and holds the first in flight
    until ``go`` is set; returns (send, sends, first_in_flight, go)."""
    sends: list[list[str]] = []
    first_in_flight, go = threading.Event(), threading.Event()

    def send(items):
        sends.append(list(items))
        if len(sends) == 1:
            first_in_flight.set()
            assert go.wait(5)
        return {item_id: answer(item) for item_id, item in items.items()}

    return send, sends, first_in_flight, go


def test_given_writes_arriving_while_one_is_in_flight_then_they_go_together_in_the_next_and_each_gets_its_own_result():
    # Given: the first write of a kind is in flight (its send held open).
    send, sends, first_in_flight, go = first_held(str.upper)

    kind = ("test", "together")
    threads, out = run_together(kind, ["a"], send)
    assert first_in_flight.wait(5)
    # When: as many more as a command carries arrive meanwhile.
    n = batches.MAX_ITEMS
    more, out_more = run_together(kind, [f"b{i}" for i in range(n)], send)
    wait_for(lambda: pending(kind) == n, 5, step=0.01)
    go.set()
    for thread in threads + more:
        thread.join(5)
    # Then: two commands in all — the first alone, the others together — and each caller is
    # told what the send answered for its own item.
    assert n > 1 and [sorted(batch) for batch in sends] == [["a"], sorted(f"b{i}" for i in range(n))]
    assert out == {"a": "ITEM A"}
    assert out_more == {f"b{i}": f"ITEM B{i}" for i in range(n)}


def test_given_more_writes_arriving_than_a_command_carries_then_they_go_in_commands_of_at_most_the_limit_in_order(
        monkeypatch):
    monkeypatch.setattr(batches, "MAX_ITEMS", 4)
    send, sends, first_in_flight, go = first_held(lambda item: "ok")

    kind = ("test", "capped")
    threads, out = run_together(kind, ["a"], send)
    assert first_in_flight.wait(5)
    ids = [f"b{i}" for i in range(10)]
    more = []
    for item_id in ids:  # one at a time, so that the order of arrival is known
        started, _ = run_together(kind, [item_id], send)
        more += started
        count = len(more)
        wait_for(lambda count=count: pending(kind) == count, 5, step=0.005)
    go.set()
    for thread in threads + more:
        thread.join(5)
    assert sends == [["a"], ids[:4], ids[4:8], ids[8:]]
    assert out == {"a": "ok"}


def test_given_a_batch_whose_command_fails_then_every_caller_in_it_gets_the_store_error_and_the_next_write_goes_on():
    kind = ("test", "fails")
    held, go = threading.Event(), threading.Event()

    def failing(items):
        held.set()
        assert go.wait(5)
        raise pymongo.errors.AutoReconnect("store gone")

    threads, out = run_together(kind, ["a"], failing)
    assert held.wait(5)
    go.set()
    for thread in threads:
        thread.join(5)
    assert isinstance(out["a"], pymongo.errors.AutoReconnect)
    # The kind is free again: a later write is sent at once.
    assert batches.combine(kind, "c", "x", lambda items: dict.fromkeys(items, "ok")) == "ok"


def test_given_the_write_ahead_never_ending_then_a_caller_gives_up_within_the_bound_without_its_item_sent(settings):
    settings.LEASES_MONGO_TIMEOUT_MS = 200  # bound: 2 x 0.2 s
    kind = ("test", "stuck")
    stuck, release = threading.Event(), threading.Event()
    sent: list[list[str]] = []

    def send(items):
        sent.append(sorted(items))
        stuck.set()
        release.wait(5)
        return dict.fromkeys(items, "ok")

    threads, _ = run_together(kind, ["a"], send)
    assert stuck.wait(5)
    started = time.monotonic()
    with pytest.raises(pymongo.errors.NetworkTimeout):
        batches.combine(kind, "late", "x", send)
    assert time.monotonic() - started < 0.4 + 0.3
    release.set()
    for thread in threads:
        thread.join(5)
    assert sent == [["a"]] and pending(kind) == 0


def test_given_a_burst_behind_several_batches_that_each_end_in_time_then_nobody_gives_up(settings, monkeypatch):
    # Given: a store bound of 0.2 s (a caller waits 0.4 s for a command ahead), one item a
    # command, and commands that take 0.15 s each.
    settings.LEASES_MONGO_TIMEOUT_MS = 200
    monkeypatch.setattr(batches, "MAX_ITEMS", 1)
    kind = ("test", "burst")

    def send(items):
        time.sleep(0.15)
        return dict.fromkeys(items, "ok")

    # When: six callers arrive together: the last waits behind five commands, 0.75 s in all.
    threads, out = run_together(kind, [f"c{i}" for i in range(6)], send)
    for thread in threads:
        thread.join(10)
    # Then: each command ahead that ended started the caller's bound again: all were sent.
    assert out == {f"c{i}": "ok" for i in range(6)}, out
