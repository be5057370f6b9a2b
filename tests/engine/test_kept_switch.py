"""A release that grants a ticket while its waiter turns it into a kept ticket (the HTTP 202).

The release reads the gate while the ticket still has its waker (so the grant records a claim
window for it), and its swap lands just before or just after the waiter's switch clears the
waker. Either way the grant is not lost: landing before, the acquire answers the lease (not
Busy); landing after, the ticket's poll deadline is its window (repair does not end it as an
unclaimed grant after the claim window), and its next poll claims it.
"""

from __future__ import annotations

import threading
from functools import partial

import pytest

import leases
from leases import service
from leases.queue import grants, waiting
from leases.store import client as store, entries, ticket_commands
from tests.helpers import define, lease_request, quiet_handler_fixture, wait_for

handler = quiet_handler_fixture("test")
req = partial(lease_request, pod="")
GATE = "res|global|*"
SCOPE = {"tenantId": "acme"}
KEEP_MS = 10000


@pytest.fixture(autouse=True)
def one_slot(settings):
    settings.LEASES_GRANT_CLAIM_MS = 100
    settings.LEASES_REPAIR_INTERVAL_MS = 50
    define("res", "levels: {global: 1}\nwaitMs: 10000\nttlSeconds: 60")


def racing_release(monkeypatch, held, *, lands_before_switch: bool):
    """When the waiter keeps its ticket (the ``keep_alive`` with ``ttl_ms``), ``held`` is
    released in another thread: its hand-off reads the gate (the ticket still has its waker)
    and computes its swap first; the swap lands before or after the switch."""
    computed, proceed = threading.Event(), threading.Event()
    real_swap, real_keep_alive = ticket_commands.swap, waiting.keep_alive

    def swap(*args, **kwargs):
        command = real_swap(*args, **kwargs)
        computed.set()
        assert proceed.wait(10), "the test never let the swap go"
        return command

    def keep_alive(gate_key, ticket_id, *, ttl_ms=None, live_at=None):
        if ttl_ms is None or live_at is not None:
            return real_keep_alive(gate_key, ticket_id, ttl_ms=ttl_ms, live_at=live_at)
        releaser = threading.Thread(target=held.release, daemon=True)
        releaser.start()
        assert computed.wait(10), "the release never computed its swap"
        if lands_before_switch:
            proceed.set()
            releaser.join(10)
            return real_keep_alive(gate_key, ticket_id, ttl_ms=ttl_ms)
        kept = real_keep_alive(gate_key, ticket_id, ttl_ms=ttl_ms)
        proceed.set()
        releaser.join(10)
        return kept

    monkeypatch.setattr(grants.ticket_commands, "swap", swap)
    monkeypatch.setattr(waiting, "keep_alive", keep_alive)


def gate_tokens():
    return [entries.token_of(e) for e in (store.counters().find_one({"_id": GATE}) or {}).get("holders") or ()]


def test_given_a_grant_landing_just_before_the_switch_to_a_kept_ticket_then_the_acquire_answers_the_lease(
        monkeypatch):
    held = leases.acquire(req(user="h"))
    racing_release(monkeypatch, held, lands_before_switch=True)
    result = service.acquire_or_ticket(req(user="w", wait_ms=200), keep_ms=KEEP_MS)
    # Then: the grant is the answer (201), not Busy (429) with the slot booked for nobody.
    assert isinstance(result, service.Lease)
    assert gate_tokens() == [result.token]
    assert store.holders().find_one({"_id": result.token})["state"] == "HELD"
    assert result.release() is True


def test_given_a_grant_landing_just_after_the_switch_to_a_kept_ticket_then_its_poll_claims_it(monkeypatch):
    held = leases.acquire(req(user="h"))
    racing_release(monkeypatch, held, lands_before_switch=False)
    ticket = service.acquire_or_ticket(req(user="w", wait_ms=200), keep_ms=KEEP_MS)
    assert isinstance(ticket, service.Ticket)
    assert gate_tokens() == [ticket.id]  # granted after the switch, with the waker's claim window
    # When: the claim window passes and a repair of the gate runs (as any waiter's would).
    granted_at = store.counters().find_one({"_id": GATE})["clock"]
    assert wait_for(lambda: store.server_now() > granted_at + grants_claim_window(), 10, step=0.02)
    gate = waiting.read_gate(GATE)
    waiting.repair(gate, gate["clock"])
    # Then: the kept ticket keeps its grant (its window is its poll deadline): the poll claims it.
    lease = service.resume(ticket.id, scope=SCOPE, keep_ms=KEEP_MS)
    assert isinstance(lease, service.Lease)
    assert store.holders().find_one({"_id": ticket.id})["state"] == "HELD"
    assert lease.release() is True


def grants_claim_window():
    from datetime import timedelta

    return timedelta(milliseconds=grants.claim_ms())
