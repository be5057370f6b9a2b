"""A kept ticket whose multi-level grant stopped half-way and whose undo never landed.

A release grants a ticket with narrower levels in one ordered bulk: the gate first (which
dequeues the ticket), then the narrower levels. When one of them is full after all (a newcomer
booked it on its way to the queue), the granter undoes the grant; if the undo fails (or the
granter dies first), the gate books the ticket's entry, the ticket is out of the queue and
its narrower level is not booked. An in-process waiter recovers through the claim window; a
kept ticket (HTTP) has none: its polls repair it (the entry back, the ticket queued again,
its arrival kept) once the grant has stayed half-done longer than any granter's bulk can run,
and it is granted in its turn.
"""

from __future__ import annotations

import threading
import time
from functools import partial

import pymongo.errors
import pytest

import leases
from leases import service
from leases.engine import funnel
from leases.store import client as store, entries, ticket_commands
from tests.helpers import define, lease_request, quiet_handler_fixture, wait_for

handler = quiet_handler_fixture("test")
req = partial(lease_request, pod="")
GATE = "res|global|*"
NARROW = "res|project|acme/p2"
SCOPE = {"tenantId": "acme"}
KEEP_MS = 10000


@pytest.fixture(autouse=True)
def two_levels(settings):
    settings.LEASES_MONGO_TIMEOUT_MS = 500  # a granter's bulk runs at most this long
    define("res", "levels: {global: 1, project: 1}\nwaitMs: 10000\nttlSeconds: 60")


def gate_tokens(key=GATE):
    return [entries.token_of(e) for e in (store.counters().find_one({"_id": key}) or {}).get("holders") or ()]


def queued(key=GATE):
    return [t["id"] for t in (store.counters().find_one({"_id": key}) or {}).get("queue") or ()]


def newcomer_on_its_way(monkeypatch):
    """A p2 newcomer that does not wait: it books the project level, finds the gate queued
    and stops before it gives the project level back (until the returned event is set)."""
    go, paused = threading.Event(), threading.Event()
    give_back = funnel.Attempt.give_back

    def held_back(self, keys, **kwargs):
        if self.request.user_id == "n":
            paused.set()
            assert go.wait(10), "the test never let the newcomer go on"
        return give_back(self, keys, **kwargs)

    monkeypatch.setattr(funnel.Attempt, "give_back", held_back)
    result = {}

    def run():
        try:
            result["lease"] = leases.acquire(req(project="p2", user="n", wait_ms=0))
        except leases.LeaseError as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert paused.wait(10), "the newcomer never booked the project level"
    return go, thread, result


def test_given_a_kept_ticket_whose_grant_stopped_half_way_and_was_never_undone_then_its_polls_repair_it(
        monkeypatch):
    # Given: p1/h holds the one global slot; p2/w's request is a kept ticket (HTTP).
    held = leases.acquire(req(user="h"))
    ticket = service.acquire_or_ticket(req(project="p2", user="w", wait_ms=0), keep_ms=KEEP_MS)
    assert isinstance(ticket, service.Ticket)
    # And: a p2 newcomer holds the project level on its way (it will give it back).
    go, newcomer, _ = newcomer_on_its_way(monkeypatch)
    assert gate_tokens(NARROW) != []
    # When: h releases; its hand-off books the gate for w and stops at the full project
    # level, and the undo fails (the store drops it).
    real_requeue = ticket_commands.requeue

    def undo_lost(*args, **kwargs):
        raise pymongo.errors.AutoReconnect("connection closed during the undo")

    monkeypatch.setattr(ticket_commands, "requeue", undo_lost)
    with pytest.raises(leases.LeaseError):
        held.release()
    monkeypatch.setattr(ticket_commands, "requeue", real_requeue)
    go.set()
    newcomer.join(10)
    # The grant is stranded half-way: the gate books w, w is not queued, p2 does not book it.
    assert gate_tokens() == [ticket.id] and queued() == [] and gate_tokens(NARROW) == []
    # Then: w's client, polling at its interval, is granted within a few polls.
    deadline = time.monotonic() + 10
    answer = service.resume(ticket.id, scope=SCOPE, keep_ms=KEEP_MS)
    while not isinstance(answer, service.Lease) and time.monotonic() < deadline:
        time.sleep(0.2)
        answer = service.resume(ticket.id, scope=SCOPE, keep_ms=KEEP_MS)
    assert isinstance(answer, service.Lease), "the kept ticket stayed stranded"
    assert gate_tokens() == [ticket.id] and gate_tokens(NARROW) == [ticket.id]
    assert store.holders().find_one({"_id": ticket.id})["state"] == "HELD"
    assert answer.release() is True
    assert wait_for(lambda: gate_tokens() == [] and gate_tokens(NARROW) == [], 5)
