"""leases.store.shapes: the short stored fields of tickets and gates behind named reads and writes."""

from __future__ import annotations

from datetime import datetime, timedelta

from leases.store import shapes

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
                   "caps": {"user": 1}, "lvl": "tenant", "w": "w1", "a": None}


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


def test_given_a_ticket_then_each_short_field_has_its_named_accessor_with_its_default():
    stored = {"t": "a", "p": "p1", "u": "u1", "lvl": "user", "bat": NOW, "w": "chan", "wt": 2.0, "wp": 0.5,
              "pc": 1, "pn": "gold", "ms": 900}
    assert shapes.owner(stored) == ("a", "p1", "u1")
    assert (shapes.blocked_level(stored), shapes.blocked_since(stored), shapes.waker(stored)) == ("user", NOW, "chan")
    assert (shapes.tenant_weight(stored), shapes.project_weight(stored)) == (2.0, 0.5)
    assert (shapes.priority_rank(stored), shapes.priority_name(stored), shapes.max_starvation_ms(stored)) == (
        1, "gold", 900)
    # A ticket without them: empty ids, rank 0, None for the rest.
    assert shapes.owner({}) == ("", "", "") and shapes.priority_rank({}) == 0
    assert shapes.blocked_level({}) is shapes.waker({}) is shapes.max_starvation_ms({}) is None


def test_given_a_gate_then_its_order_and_estimate_fields_have_named_accessors():
    gate = {"vt": {"a": 1.5}, "vf": 2, "er": [1.1]}
    assert shapes.tenant_passes(gate) == {"a": 1.5} and shapes.passes_floor(gate) == 2.0
    assert shapes.estimate_ratios(gate) == [1.1]
    assert (shapes.tenant_passes({}), shapes.passes_floor({}), shapes.estimate_ratios({})) == ({}, 0.0, ())
