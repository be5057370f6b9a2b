"""A kept ticket (the HTTP protocol's) granted between polls: its poll deadline is its window.

A release grants the slot to a ticket whose client polls it (no waker, no claim window): the
ticket's holder lives to its poll deadline, not the lease's TTL, so a client that stops
polling gives the slot back then; a poll after the deadline is told EXPIRED, not the lease;
and giving the granted ticket up (DELETE) returns its slot at once.
"""

from __future__ import annotations

from functools import partial

import pytest

import leases
from leases import service
from leases.errors import LeaseExpired
from leases.store import client as store, entries
from tests.helpers import define, lease_request, quiet_handler_fixture, wait_for

handler = quiet_handler_fixture("test")
req = partial(lease_request, pod="")
GATE = "res|global|*"
SCOPE = {"tenantId": "acme"}
KEEP_MS = 1000  # the poll deadline: far shorter than the lease's TTL (60 s)


@pytest.fixture(autouse=True)
def one_slot():
    define("res", "levels: {global: 1}\nwaitMs: 10000\nttlSeconds: 60")


def granted_between_polls():
    """A kept ticket behind a holder, granted by the holder's release (no poll since): the ticket."""
    held = leases.acquire(req(user="h"))
    ticket = service.acquire_or_ticket(req(user="w", wait_ms=0), keep_ms=KEEP_MS)
    assert isinstance(ticket, service.Ticket)
    held.release()
    assert gate_tokens() == [ticket.id]  # the release booked the slot for it (the direct hand-off)
    assert store.holders().find_one({"_id": ticket.id})["state"] == "PENDING"
    return ticket


def gate_tokens():
    return [entries.token_of(e) for e in (store.counters().find_one({"_id": GATE}) or {}).get("holders") or ()]


def past(deadline) -> None:
    assert wait_for(lambda: store.server_now() > deadline, 10, step=0.02), "the server clock never passed it"


def test_given_a_ticket_granted_between_polls_when_its_client_stops_polling_then_the_slot_comes_back_at_its_deadline():
    ticket = granted_between_polls()
    # When: its client stops polling and the deadline passes, another request waits.
    past(ticket.deadline)
    other = leases.acquire(req(user="x", wait_ms=5000))
    # Then: it gets the slot (repair ends the unpolled grant); the ticket is over.
    assert gate_tokens() == [other.token]
    with pytest.raises(LeaseExpired):
        service.resume(ticket.id, scope=SCOPE, keep_ms=KEEP_MS)
    other.release()


def test_given_a_ticket_granted_between_polls_when_polled_after_its_deadline_then_expired_not_the_lease():
    ticket = granted_between_polls()
    # When: the client polls only after the deadline.
    past(ticket.deadline)
    with pytest.raises(LeaseExpired) as late:
        service.resume(ticket.id, scope=SCOPE, keep_ms=KEEP_MS)
    # Then: EXPIRED (ticket-expired), its slot given back, and it stays expired.
    assert late.value.reason == "ticket-expired"
    assert gate_tokens() == []
    assert store.holders().find_one({"_id": ticket.id}) is None
    with pytest.raises(LeaseExpired):
        service.resume(ticket.id, scope=SCOPE, keep_ms=KEEP_MS)
    assert leases.acquire(req(user="x", wait_ms=0)).release() is True


def test_given_a_ticket_granted_between_polls_when_polled_in_time_then_it_is_the_lease():
    ticket = granted_between_polls()
    lease = service.resume(ticket.id, scope=SCOPE, keep_ms=KEEP_MS)
    assert isinstance(lease, service.Lease)
    holder = store.holders().find_one({"_id": ticket.id})
    assert holder["state"] == "HELD" and holder["expiresAt"] == lease.expires_at
    # The claimed lease has its TTL from the claim.
    assert (lease.expires_at - lease.last_seen_at).total_seconds() == 60
    assert lease.release() is True


def test_given_a_ticket_granted_between_polls_when_given_up_then_its_slot_comes_back_at_once():
    ticket = granted_between_polls()
    assert service.abandon(ticket.id, scope=SCOPE) is True
    # Then: no entry is left for repair: the slot is free now.
    assert gate_tokens() == []
    assert store.counters().find_one({"_id": GATE})["count"] == 0
    with pytest.raises(LeaseExpired) as gone:
        service.resume(ticket.id, scope=SCOPE, keep_ms=KEEP_MS)
    assert gone.value.reason == "abandoned"
