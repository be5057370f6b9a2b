"""leases.engine.shapes: the queue ticket's short stored fields behind named reads and writes."""

from __future__ import annotations

from datetime import datetime, timedelta

from leases.engine import shapes

NOW = datetime(2026, 12, 5, 8, 0, 0)


def ticket(token="tok", **fields):
    return shapes.new_ticket(token=token, tenant="acme", project="web", user="bob", arrived=NOW,
                             seen=fields.pop("seen", None), ttl_ms=fields.pop("ttl_ms", 5000), caps={"user": 1},
                             level="tenant", waker="w1")


def test_given_named_fields_when_a_ticket_is_written_then_it_stores_the_short_names_of_the_document():
    # given / when
    doc = ticket()
    # then: the stored shape is the one every reader of a gate (order, shares, estimates) expects
    assert doc == {"id": "tok", "t": "acme", "p": "web", "u": "bob", "at": NOW, "seen": NOW, "ttl": 5000,
                   "caps": {"user": 1}, "lvl": "tenant", "w": "w1"}


def test_given_a_gate_queue_then_ticket_in_finds_the_requests_ticket_and_none_for_others():
    # given
    first, second = ticket("a"), ticket("b")
    gate = {"_id": "g", "queue": [first, second]}
    # when / then
    assert shapes.ticket_in(gate, "b") is second
    assert shapes.ticket_in(gate, "c") is None
    assert shapes.ticket_in({"_id": "g"}, "a") is None
    assert shapes.queue_of({"_id": "g"}) == [] and shapes.queue_of(gate) == [first, second]
    assert shapes.arrived_at(first) == NOW and shapes.arrived_at({}) is None


def test_given_a_ticket_then_its_deadline_is_its_last_keep_alive_plus_its_ttl():
    # given a ticket kept alive 2 s after it arrived, living 5 s without a keep-alive
    kept = ticket(seen=NOW + timedelta(seconds=2))
    # when / then
    assert shapes.ticket_deadline(kept, NOW) == NOW + timedelta(seconds=7)
    # a ticket never seen (no such ticket in the queue) ends now
    later = NOW + timedelta(minutes=1)
    assert shapes.ticket_deadline({}, later) == later
