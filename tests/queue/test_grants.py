"""Direct hand-off (``leases.queue.grants``): the release that frees a gate slot books it for
the ticket the order rule picks, narrower levels included, in one bulk; the waiter claims."""

from __future__ import annotations

import threading
from datetime import timedelta
from functools import partial

import pymongo
import pytest

import leases
from leases.queue import grants, waiting
from leases.store import client as store, entries
from tests import helpers
from tests.faults import quiet_waiter
from tests.helpers import define, lease_request, quiet_handler_fixture

handler = quiet_handler_fixture("test")
req = partial(lease_request, pod="")
GATE, GLOBEX, ACME = "res|global|*", "res|tenant|globex", "res|tenant|acme"


def tokens(key):
    return [entries.token_of(e) for e in (store.counters().find_one({"_id": key}) or {}).get("holders") or ()]


@pytest.fixture
def two_levels():
    define("res", "levels: {global: 1, tenant: 1}\nwaitMs: 10000")


def test_given_a_multi_level_ticket_when_the_holder_releases_then_one_bulk_books_all_its_levels(two_levels):
    # Given: acme holds the one global slot; a globex request waits with its tenant level free.
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(tenant="globex", user="w"), GATE)
    ticket = helpers.queued_ids(GATE)[0]
    # When: the holder releases, its counter commands counted.
    with helpers.counted_commands() as counter:
        held.release()
    # Then: after the holder's delete, one read of the gate and one bulk returned the holder's
    # tenant slot, swapped its gate entry for the ticket's and booked the ticket's tenant
    # level; nothing else wrote a counter (no findAndModify of the plain way), and the ticket
    # left the queue.
    assert counter.commands[:3] == ["delete", "aggregate", "update"] and "findAndModify" not in counter.commands
    assert tokens(GATE) == [ticket] and tokens(GLOBEX) == [ticket] and tokens(ACME) == []
    assert helpers.queued_ids(GATE) == []
    waiter.join(10)
    assert waiter.lease is not None and waiter.lease.token == ticket and waiter.lease.fence is not None
    waiter.lease.wait_claimed()
    assert store.holders().find_one({"_id": ticket})["state"] == "HELD"
    waiter.lease.release()
    assert tokens(GATE) == [] and tokens(GLOBEX) == []


def test_given_a_narrower_level_a_newcomer_booked_when_the_release_grants_then_it_undoes_and_requeues(two_levels):
    # Given: the waiting ticket's tenant level is full (a newcomer of its tenant booked it on
    # its way to the queue: an entry that holds only for a moment).
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(tenant="globex", user="w"), GATE)
    ticket = helpers.queued_ids(GATE)[0]
    arrived = store.counters().find_one({"_id": GATE})["queue"][0]["at"]
    newcomer = entries.entry("globex", "p1", "n", "newcomer-token", "a1")
    # Its holder document exists (written before its first entry), so no repair takes the entry
    # for an orphan while the test looks.
    store.holders().insert_one({"_id": "newcomer-token", "attemptId": "a1", "state": "PENDING",
                                "expiresAt": store.server_now() + timedelta(hours=1)})
    store.counters().update_one({"_id": GLOBEX}, {"$push": {"holders": newcomer}, "$inc": {"count": 1}})
    # When: the holder releases (its grant finds the tenant level full).
    held.release()
    # Then: nothing of the ticket stays booked, it is queued again with its arrival, and the
    # holder's slots are back (the gate's is free: the grant took it and gave it back).
    gate = store.counters().find_one({"_id": GATE})
    assert held.token not in tokens(GATE) and ticket not in tokens(GATE) and gate["count"] == len(tokens(GATE))
    assert tokens(GLOBEX) == ["newcomer-token"] and tokens(ACME) == []
    assert [(t["id"], t["at"]) for t in gate["queue"]] == [(ticket, arrived)]
    # Once the newcomer is gone, the waiter gets its turn (it books itself when woken).
    store.holders().delete_one({"_id": "newcomer-token"})
    waiting.give_back([GLOBEX], newcomer)
    waiter.join(10)
    assert waiter.lease is not None and waiter.lease.token == ticket
    waiter.lease.release()


def test_given_a_ticket_fenced_on_a_narrower_level_then_it_is_not_granted_directly():
    define("res", "levels: {global: 1, user: 1}\nwaitMs: 10000\nfence: user")
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(user="w"), GATE)
    ticket = store.counters().find_one({"_id": GATE})["queue"][0]
    assert "lv" not in ticket and not grants.grantable(ticket, store.server_now())
    held.release()
    waiter.join(10)
    assert waiter.lease is not None  # woken, it booked itself
    waiter.lease.release()


def test_given_a_grant_seen_on_the_gate_alone_then_the_waiter_claims_only_once_its_narrower_levels_are_booked(
        two_levels, settings, monkeypatch):
    # Given: no wake-ups reach anyone (the waiter learns of grants from the gate), and a
    # grant whose bulk has booked the gate but not yet the ticket's tenant level.
    settings.LEASES_WAIT_POLL_MS = 200
    monkeypatch.setattr(waiting, "hand_off", lambda gate, skip=None: [])  # nobody grants or wakes
    monkeypatch.setattr(grants, "hand_back", lambda *args, **kwargs: None)  # nor swaps on release
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(tenant="globex", user="w"), GATE)
    ticket = store.counters().find_one({"_id": GATE})["queue"][0]
    held.release()
    booking = grants.booking_of(ticket)
    store.counters().update_one({"_id": GATE}, {"$push": {"holders": booking}, "$inc": {"count": 1},
                                                "$pull": {"queue": {"id": ticket["id"]}}})
    # When: the waiter reads the gate on its keep-alives. Then: it does not claim yet.
    waiter.join(1.0)
    assert waiter.lease is None
    assert store.holders().find_one({"_id": ticket["id"]})["state"] == "PENDING"
    # When: the bulk books the tenant level too. Then: the waiter claims the lease.
    store.counters().update_one({"_id": GLOBEX}, {"$push": {"holders": booking}, "$inc": {"count": 1}})
    waiter.join(5)
    assert waiter.lease is not None and waiter.lease.token == ticket["id"]
    waiter.lease.release()


@pytest.fixture
def one_slot():
    define("res", "levels: {global: 1}\nwaitMs: 10000")


def fence_slot(key, slot=0):
    return (store.counters().find_one({"_id": key}).get("fence") or {}).get(f"s{slot}")


def test_given_a_waiting_ticket_when_the_holder_releases_then_one_update_returns_and_grants_the_slot(one_slot):
    # Given: the one slot is held and a ticket waits (this process saw the queue).
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(user="w"), GATE)
    before = fence_slot(GATE)
    # When: the holder releases, its gate commands counted.
    with helpers.counted_commands() as counter:
        held.release()
    # Then: after the holder's delete, the gate was read once and written once — the entry
    # swapped, not pulled and then pushed — and the ticket holds the same slot one generation
    # up; the count never moved.
    assert counter.commands[:3] == ["delete", "aggregate", "update"] and "findAndModify" not in counter.commands[:3]
    gate = store.counters().find_one({"_id": GATE})
    assert tokens(GATE) == [waiter.ticket] and gate["count"] == 1 and helpers.queued_ids(GATE) == []
    after = fence_slot(GATE)
    assert after["g"] > before["g"] and entries.token_of(after["e"]) == waiter.ticket
    waiter.join(10)
    assert waiter.lease is not None and waiter.lease.token == waiter.ticket
    waiter.lease.wait_claimed()
    holder = store.holders().find_one({"_id": waiter.ticket})
    assert holder["state"] == "HELD" and holder["fence"] == waiter.lease.fence
    # The TTL runs from the grant's time on MongoDB's clock, which the wake-up carried: the
    # lease was told exactly the deadline and server time its holder has.
    assert (waiter.lease.expires_at, waiter.lease.last_seen_at) == (holder["expiresAt"], holder["lastSeenAt"])
    assert holder["heldAt"] >= holder["lastSeenAt"] and waiter.lease.fence == holder["fence"]
    waiter.lease.release()
    assert tokens(GATE) == [] and store.counters().find_one({"_id": GATE})["count"] == 0


def test_given_a_grant_woken_with_its_time_then_the_waiter_returns_and_the_claim_is_one_plain_update(
        one_slot, settings):
    # Given: a ticket waits; every command is recorded with the thread that sent it. The
    # waiter's own upkeep stays out of the way whatever the machine's load (tests.faults.quiet):
    # scheduled late, its first decision after it queued — a repair check of the full gate,
    # which reads the holders — landed after the test's clear() below (the `find` seen once on
    # a loaded machine), and a keep-alive poll that comes before the wake-up finds the grant on
    # the gate and claims it itself, as it should.
    from pymongo import monitoring

    class ByThread(monitoring.CommandListener):
        def __init__(self):
            self.seen = []

        def started(self, event):
            # The thread itself, not its ident: an ended thread's ident is reused by the next.
            self.seen.append((threading.current_thread(), event.command_name, event.command.get(event.command_name)))

        def succeeded(self, event):
            pass

        def failed(self, event):
            pass

    listener = ByThread()
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[listener])
    store.set_client(client)
    try:
        held = leases.acquire(req(user="h"))
        waiter = quiet_waiter(settings, req(user="w"), GATE)
        listener.seen.clear()
        # When: the holder releases (the wake-up carries the grant's time).
        held.release()
        waiter.join(10)
        assert waiter.lease is not None
        # The claim is due after its share of the window (LEASES_GRANT_MARK_DELAY_MS).
        assert helpers.wait_for(lambda: store.holders().find_one({"_id": waiter.lease.token, "state": "HELD"}),
                                10, step=0.01)
        waiter.lease.check()  # the claim landed: it only renews
        # Then: the waiter's own thread sent nothing to the holders before it returned; its
        # claim was one plain update (no document asked back) from the claim thread.
        on_holders = [(thread, name) for thread, name, coll in listener.seen if coll == store.HOLDERS]
        assert [name for thread, name in on_holders if thread is waiter] == []
        assert [name for thread, name in on_holders if thread.name.startswith("leases-claim")] == ["update"]
        assert store.holders().find_one({"_id": waiter.lease.token})["state"] == "HELD"
        waiter.lease.release()
    finally:
        store.set_client(None)
        client.close()


def test_given_another_hand_off_between_the_read_and_the_swap_then_the_release_reads_and_swaps_again(monkeypatch):
    # Given: two holders of a cap of 2 and two waiting tickets; the other holder's whole
    # hand-off lands between the first releaser's read and its swap.
    from leases.store import ticket_commands

    define("res", "levels: {global: 2}\nwaitMs: 10000")
    first, other = leases.acquire(req(user="h1")), leases.acquire(req(user="h2"))
    w1 = helpers.queue_up(req(user="w1"), GATE)
    w2 = helpers.queue_up(req(user="w2"), GATE)
    swap, raced = ticket_commands.swap, []

    def racing(*args, **kwargs):
        if not raced:
            raced.append(kwargs["ticket_id"])
            other.release()  # its own read and swap run here, in full
        return swap(*args, **kwargs)

    monkeypatch.setattr(ticket_commands, "swap", racing)
    # When: the first holder releases.
    with helpers.counted_commands() as counter:
        first.release()
    # Then: its first swap matched nothing (the entries had changed), it read and swapped
    # again — no findAndModify of the plain way — and each ticket got one slot, once.
    assert raced == [w1.ticket]
    assert "findAndModify" not in counter.commands and counter.commands.count("aggregate") == 3
    gate = store.counters().find_one({"_id": GATE})
    assert sorted(tokens(GATE)) == sorted([w1.ticket, w2.ticket]) and gate["count"] == 2
    assert helpers.queued_ids(GATE) == []
    for waiter in (w1, w2):
        waiter.join(10)
        assert waiter.lease is not None
        waiter.lease.release()
    assert tokens(GATE) == []


def test_given_a_multi_level_swap_raced_then_the_bulk_stops_at_the_gate_and_the_release_swaps_again(
        two_levels, monkeypatch):
    # Given: acme holds the one global slot, a globex ticket waits, and the first swap the
    # release sends matches nothing (as when another hand-off changed the gate in between).
    from leases.store import ticket_commands

    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(tenant="globex", user="w"), GATE)
    ticket = helpers.queued_ids(GATE)[0]
    swap, raced = ticket_commands.swap, []

    def stale(*args, **kwargs):
        query, update = swap(*args, **kwargs)
        if not raced:
            raced.append(kwargs["ticket_id"])
            query = {**query, "count": 99}  # the gate as "read" no longer is
        return query, update

    monkeypatch.setattr(ticket_commands, "swap", stale)
    counters_before = store.counters().count_documents({})
    # When: the holder releases.
    with helpers.counted_commands() as counter:
        held.release()
    # Then: the first bulk returned acme's tenant slot and stopped at the gate (its upsert
    # collided: nothing booked for the ticket, no counter created); the release read and
    # swapped again, and the ticket holds both levels, once.
    assert raced == [ticket]
    assert counter.commands[:5] == ["delete", "aggregate", "update", "aggregate", "update"]
    assert "findAndModify" not in counter.commands
    assert store.counters().count_documents({}) == counters_before
    assert tokens(GATE) == [ticket] and tokens(GLOBEX) == [ticket] and tokens(ACME) == []
    gate = store.counters().find_one({"_id": GATE})
    assert gate["count"] == 1 and helpers.queued_ids(GATE) == []
    waiter.join(10)
    assert waiter.lease is not None and waiter.lease.token == ticket
    waiter.lease.release()
    assert tokens(GATE) == [] and tokens(GLOBEX) == []


def test_given_the_ticket_leaves_between_the_read_and_the_swap_then_the_slot_is_returned_once(one_slot, monkeypatch):
    # Given: a ticket waits, and it leaves the queue (its waiter's deadline) right after the
    # releaser read the gate.
    from leases.store import ticket_commands

    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(user="w", wait_ms=400), GATE)
    swap = ticket_commands.swap

    def racing(*args, **kwargs):
        waiting.dequeue(GATE, waiter.ticket)
        return swap(*args, **kwargs)

    monkeypatch.setattr(ticket_commands, "swap", racing)
    # When: the holder releases.
    held.release()
    # Then: the swap matched nothing and the plain return gave the slot back, once; nobody
    # was granted it.
    gate = store.counters().find_one({"_id": GATE})
    assert gate["holders"] == [] and gate["count"] == 0 and helpers.queued_ids(GATE) == []
    waiter.join(10)
    assert waiter.lease is None or waiter.lease.token == waiter.ticket
    if waiter.lease is not None:
        waiter.lease.release()
