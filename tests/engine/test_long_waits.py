"""A wait longer than the lease's TTL: the waiter is never granted a lease that is already dead.

A waiting holder (``PENDING``) has its deadline moved once, when half its TTL is gone, to
cover the rest of the wait, so the idle sweep leaves it while its ticket queues with no
keep-alive per period; a holder reaped anyway makes the waiter queue again when its grant
comes, never return a lease whose first check fails.
"""

from __future__ import annotations

import time
from datetime import timedelta
from functools import partial

import pytest

import leases
from leases.queue import wakeups
from leases.store import client as store, entries
from leases.upkeep import reaper
from tests import helpers
from tests.helpers import define, lease_request, quiet_handler_fixture

handler = quiet_handler_fixture("test")
req = partial(lease_request, pod="")
GATE = "res|global|*"
TTL_S = 2


@pytest.fixture
def short_ttl(settings):
    """One slot whose TTL (2 s) is far shorter than the wait (20 s)."""
    define("res", f"levels: {{global: 1}}\nwaitMs: 20000\nttlSeconds: {TTL_S}")


def outlive_ttl(held, token: str, seconds: float = TTL_S) -> None:
    """Keep ``held`` renewed until the waiter ``token``'s holder is older than ``seconds`` (the
    lease's TTL: a holder with no more than the TTL would be the idle sweep's now) on
    MongoDB's clock."""
    first = store.holders().find_one({"_id": token})["acquiredAt"] + timedelta(seconds=seconds)
    deadline = time.monotonic() + 10
    while store.server_now() <= first:
        assert time.monotonic() < deadline, "MongoDB's clock never passed the holder's first deadline"
        held.check()
        time.sleep(0.1)
    held.check()


def assert_a_live_lease(waiter):
    """The waiter was granted a live lease: its check renews it, its holder is HELD, it releases."""
    lease = waiter.lease
    assert lease is not None, waiter.error
    lease.check()
    assert store.holders().find_one({"_id": lease.token})["state"] == "HELD"
    assert lease.release() is True


def test_given_a_wait_longer_than_the_ttl_when_the_idle_sweep_runs_then_the_grant_is_a_live_lease(short_ttl):
    # Given: a holder, and a waiter that waits longer than the lease's TTL: its holder's
    # deadline is moved once to cover the wait (20 s + the TTL), and not again.
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(user="w"), GATE)
    outlive_ttl(held, waiter.ticket)
    covered = store.holders().find_one({"_id": waiter.ticket})
    assert covered["expiresAt"] - covered["acquiredAt"] >= timedelta(seconds=TTL_S + 15), covered
    outlive_ttl(held, waiter.ticket, seconds=TTL_S * 1.5)
    assert store.holders().find_one({"_id": waiter.ticket})["expiresAt"] == covered["expiresAt"]
    # When: the idle sweep runs, then the holder releases (its slot goes to the waiter).
    reaper.reap_idle(dispatch=False)
    held.release()
    waiter.join(10)
    # Then: the waiter's lease is alive: its check renews it, its holder is HELD.
    assert_a_live_lease(waiter)


def test_given_a_waiter_whose_holder_is_reaped_anyway_when_granted_then_it_queues_again_never_dead(
        short_ttl, monkeypatch):
    # Given: a waiter whose holder is reaped while its ticket stays queued (by a sweep that
    # does not go by its deadline: an operator, or its pod's), and whose grant's wake-up is
    # lost, so that it finds the grant on the gate.
    monkeypatch.setattr(wakeups, "grant", lambda *args, **kwargs: wakeups.UNKNOWN)
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(user="w"), GATE)
    outlive_ttl(held, waiter.ticket)
    store.holders().update_one({"_id": waiter.ticket}, {"$set": {"expiresAt": store.server_now() - timedelta(seconds=1)}})
    reaper.reap_idle(dispatch=False)  # counts HELD holders only: a waiting one has no handler
    assert store.holders().find_one({"_id": waiter.ticket}) is None
    # When: the holder releases.
    held.release()
    waiter.join(10)
    # Then: the waiter did not get a dead lease: it queued again and holds a live one.
    assert_a_live_lease(waiter)
    assert store.counters().find_one({"_id": GATE})["holders"] == []


def test_given_tickets_waiting_at_the_gate_then_a_newcomer_writes_its_holder_to_cover_its_wait_at_once(short_ttl):
    # Given: a holder and a waiter queued (this process saw tickets waiting at the gate)
    held = leases.acquire(req(user="h"))
    first = helpers.queue_up(req(user="w1"), GATE)
    # When: another request arrives: it will most likely queue too
    second = helpers.queue_up(req(user="w2"), GATE)
    # Then: its holder was written covering its whole wait (20 s + the TTL), not only the TTL,
    # so that a thousand waiters that arrived together do not all move their deadlines half a
    # TTL later, together again
    doc = store.holders().find_one({"_id": second.ticket})
    assert doc["expiresAt"] - doc["acquiredAt"] >= timedelta(seconds=TTL_S + 19), doc
    # and it is never moved again (the waiter sends nothing while it queues)
    outlive_ttl(held, second.ticket, seconds=TTL_S * 0.75)
    assert store.holders().find_one({"_id": second.ticket})["expiresAt"] == doc["expiresAt"]
    # and both are granted live leases in turn
    held.release()
    first.join(10)
    assert_a_live_lease(first)
    second.join(10)
    assert_a_live_lease(second)


def test_given_a_grant_to_an_earlier_writing_of_the_waiters_holder_then_it_is_given_back_and_the_waiter_is_granted(
        short_ttl):
    # Given: a waiter queued with its holder as written now, and on the gate a grant to an
    # earlier writing of that holder (made while its process was stopped past the TTL, which
    # then wrote its holder again and queued again), its wake-up read only now. The earlier
    # holder is gone: nobody can claim that entry.
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(user="w"), GATE)
    earlier = entries.entry("acme", "p1", "w", waiter.ticket, entries.new_attempt_id())
    gate = store.counters().find_one({"_id": GATE})
    assert store.counters().update_one({"_id": GATE, "holders": gate["holders"]},
                                       {"$set": {"holders": [earlier]}}).matched_count
    store.holders().delete_one({"_id": held.token})  # its slot is the earlier grant's now
    # When: the waiter is told of that grant.
    wakeups.grant(waiter.ticket, wakeups.process_id(), earlier, None)
    # Then: it gives the entry back — the slot goes to its ticket as queued now — and holds a
    # live lease at once, not at the end of its wait. (It used to write its holder again on
    # each failed claim, which ended the grant its own give-back had just made: a loop that
    # kept the slot from everyone until the waiter's deadline.)
    waiter.join(5)
    assert not waiter.is_alive(), "the waiter is still waiting: the slot goes round in a loop"
    assert_a_live_lease(waiter)
    assert store.counters().find_one({"_id": GATE})["holders"] == []
