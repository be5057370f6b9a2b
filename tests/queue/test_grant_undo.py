"""A multi-level grant whose bulk was applied but whose answer was lost (issue 34, item 6):
the granter undoes what it cannot know landed, and its waiter may have seen the grant whole
and claimed it in between. A claimed lease is never stripped of its slots, and a claim sent
after the undo began never marks a holder whose entries are being pulled."""

from __future__ import annotations

from functools import partial

import pytest

import leases
from leases.engine import claims, holders
from leases.queue import grants, waiting, wakeups
from leases.store import client as store, entries, holder_commands
from tests import helpers
from tests.checker.slots import counter_problems
from tests.faults import answer_lost, quiet_waiter
from tests.helpers import define, lease_request, quiet_handler_fixture

handler = quiet_handler_fixture("test")
req = partial(lease_request, pod="")
GATE, GLOBEX = "res|global|*", "res|tenant|globex"


@pytest.fixture
def two_levels():
    define("res", "levels: {global: 1, tenant: 1}\nwaitMs: 10000")


def a_grant(ops, *args, **kwargs) -> bool:
    """Whether a counters bulk is a grant's (its bookings are upserts), not a give-back's."""
    return any(getattr(op, "_upsert", False) for op in ops)


def release_seeing_the_queue(lease):
    """Release ``lease`` as a process that saw the queue a moment ago (the hint lasts 1 s,
    which a loaded machine may take between the waiter's enqueue and the release)."""
    waiting.note_queue(store.counters().find_one({"_id": GATE}))
    lease.release()


def tokens(key):
    return [entries.token_of(e) for e in (store.counters().find_one({"_id": key}) or {}).get("holders") or ()]


def fence_slots(key) -> dict[str, str]:
    """The counter's fence slots and the entry each records last."""
    recorded = (store.counters().find_one({"_id": key}) or {}).get("fence") or {}
    return {name: str(value.get("e") or "") for name, value in recorded.items()}


def held_with_its_slots(token) -> bool:
    """The invariant: a HELD holder books its entry on every one of its levels, under the
    fence the gate records for that entry (a slot taken away and granted again meanwhile
    would have issued another)."""
    holder = store.holders().find_one({"_id": token})
    if holder is None or holder["state"] != "HELD":
        return True
    gate = store.counters().find_one({"_id": GATE})
    booking = grants.granted_entry(gate, token)
    return (booking is not None and token in tokens(GLOBEX)
            and grants.fence_of(gate, booking) == holder["fence"])


def test_given_the_grant_bulk_applied_and_claimed_before_its_lost_answer_then_the_undo_leaves_the_lease_whole(
        two_levels, monkeypatch, settings):
    # Given: acme holds the one global slot and a globex ticket (tenant level free) waits; the
    # release's grant bulk is applied, its answer lost — and in between, the ticket's holder
    # is marked HELD from the gate, as its waiter (or an operator's take-up) does when it
    # sees the grant whole.
    held = leases.acquire(req(user="h"))
    waiter = quiet_waiter(settings, req(tenant="globex", user="w"), GATE)
    ticket = waiter.ticket
    claimed = []
    answer_lost(monkeypatch, "bulk_write", store.COUNTERS, when=a_grant,
                then=lambda: claimed.append(claims.take_up(ticket)))
    # When: the holder releases (its hand-off undoes a grant whose outcome it does not know).
    release_seeing_the_queue(held)
    monkeypatch.undo()
    # Then: the claim landed, and the lease it made keeps its slots: the undo did not pull
    # the entries of a HELD holder (nor queue its ticket again).
    assert claimed == [True]
    assert store.holders().find_one({"_id": ticket})["state"] == "HELD"
    assert held_with_its_slots(ticket)
    assert ticket not in helpers.queued_ids(GATE)
    waiter.join(10)
    assert waiter.lease is not None and waiter.lease.token == ticket
    waiter.lease.release()
    assert tokens(GATE) == [] and tokens(GLOBEX) == []


def test_given_a_grant_seen_whole_before_the_undo_then_its_claim_after_the_undo_marks_nothing(
        two_levels, monkeypatch, settings):
    # Given: the release's grant bulk is applied, its answer lost; a waiter reads the grant
    # whole in between (its entry on the gate and the tenant level) and is about to mark it.
    held = leases.acquire(req(user="h"))
    waiter = quiet_waiter(settings, req(tenant="globex", user="w"), GATE)
    ticket = waiter.ticket
    seen = []

    def read_whole():
        seen.append(grants.grant_on(store.counters().find_one({"_id": GATE}), ticket, [GLOBEX]))

    answer_lost(monkeypatch, "bulk_write", store.COUNTERS, when=a_grant, then=read_whole)
    holder = store.holders().find_one({"_id": ticket})
    # When: the release undoes the grant, and the waiter's mark for what it saw lands after.
    release_seeing_the_queue(held)
    monkeypatch.undo()
    assert seen and seen[0] is not None and seen[0].complete
    mark = holder_commands.mark_held(ticket, keys=holder["keys"], ttl_seconds=holder["ttlSeconds"],
                                     attempt_id=holder["attemptId"], fence=seen[0].fence)
    store.holders().update_one(*mark)
    # Then: that mark matched nothing — no HELD holder without its slots.
    assert held_with_its_slots(ticket)
    assert store.holders().find_one({"_id": ticket})["state"] == "PENDING"
    # The waiter goes on and gets the slot (as a later grant, or booking it itself).
    waiter.join(15)
    assert waiter.lease is not None and waiter.lease.token == ticket
    assert held_with_its_slots(ticket)
    waiter.lease.release()
    assert tokens(GATE) == [] and tokens(GLOBEX) == []



@pytest.mark.parametrize("first_back", ["its lease's release", "its waiter"])
def test_given_a_grant_whose_entry_came_back_before_its_lost_answer_was_undone_then_it_books_one_fence_slot(
        first_back, monkeypatch, settings):
    # Given: global cap 2 (the gate, which fences), tenant cap 1; initech/o holds gate slot s0,
    # acme/r holds s1, and a globex ticket waits. r releases and hands its slot over in one
    # bulk: the ticket's entry swapped in on s1. The bulk is applied, its answer lost. Before
    # r's undo pulls the entry, somebody else gives it back — by value, which clears no slot:
    # s1 still names it — either the release of the lease claimed from the gate before the
    # undo began, or the waiter whose claim found the grant undone; and o releases too.
    define("res", "levels: {global: 2, tenant: 1}\nwaitMs: 10000")
    first = leases.acquire(req(tenant="initech", user="o"))
    second = leases.acquire(req(user="r"))
    on_s1 = {first.token: first, second.token: second}[entries.token_of(fence_slots(GATE)["s1"])]
    other = second if on_s1 is first else first
    waiter = quiet_waiter(settings, req(tenant="globex", user="w"), GATE)
    ticket = waiter.ticket
    told = []
    monkeypatch.setattr(grants, "_tell", lambda *args: told.append(args))  # its waiter sleeps on
    monkeypatch.setattr(waiting, "wake", lambda gate, ids: [])

    def given_back(claimed: bool):
        holder = store.holders().find_one({"_id": ticket})
        grant = grants.grant_on(store.counters().find_one({"_id": GATE}), ticket, [GLOBEX])
        assert grant is not None and grant.complete
        if claimed:  # claimed (as its waiter or an operator's take-up does), used, released
            assert claims.take_up(ticket)
            holders.release_owned(ticket, holder["keys"], grant.booking)
        else:  # its waiter's claim finds the grant undone: it gives the entry back
            mark = holder_commands.mark_held(ticket, keys=holder["keys"], ttl_seconds=holder["ttlSeconds"],
                                             attempt_id=holder["attemptId"], fence=grant.fence)
            assert not store.holders().update_one(*mark).matched_count
            waiting.give_back(holder["keys"], grant.booking)
        other.release()

    if first_back == "its waiter":
        real_undo = grants.undo

        def undo_after_the_waiter(*args, **kwargs):
            given_back(claimed=False)
            real_undo(*args, **kwargs)

        monkeypatch.setattr(grants, "undo", undo_after_the_waiter)
        answer_lost(monkeypatch, "bulk_write", store.COUNTERS, when=a_grant)
    else:
        answer_lost(monkeypatch, "bulk_write", store.COUNTERS, when=a_grant, then=lambda: given_back(claimed=True))
    # When: r's hand-off goes on: its undo, then the hand-off of the free slots.
    release_seeing_the_queue(on_s1)
    monkeypatch.undo()
    # Then: no booking entry occupies two fence slots of the gate (one slot would idle until
    # repair pulls the entry, or for the whole hold of a lease claimed on it), and the ticket
    # whose entry came back is not queued, nor granted, again with it.
    gate = store.counters().find_one({"_id": GATE})
    assert counter_problems(gate, 0.0) == []
    assert ticket not in helpers.queued_ids(GATE) and tokens(GATE) == [] and tokens(GLOBEX) == []
    wakeups._deliver([ticket])  # its waiter queues again (with a holder of its own) and books
    waiter.join(15)
    assert waiter.lease is not None, waiter.error
    waiter.lease.release()
    assert tokens(GATE) == [] and tokens(GLOBEX) == []
