"""A lowered cap binds bookings on counters its write could not stamp: those created after
the write (by a waiter's view, a kept ticket's ``lv``, a stale cache) and those deleted idle
since and created again. Each test lowers a narrower cap with a real definition write
(which stamps what exists) and then books, from views loaded before it, a counter that did
not exist at the stamp: the level must end at or below its new cap."""

from __future__ import annotations

from datetime import timedelta

import pytest

import leases
from leases import service
from leases.definitions import model as definitions
from leases.store import client as store
from leases.upkeep import sweeps
from tests.helpers import define, lease_request, queue_up, quiet_handler_fixture, wait_for

handler = quiet_handler_fixture()

P1 = "res|project|acme/p1"
GATE = "res|global|*"
SCOPE = {"tenantId": "acme"}


def stored(key):
    return store.counters().find_one({"_id": key}) or {}


def held_in_p1():
    return store.holders().count_documents({"tenantId": "acme", "projectId": "p1", "state": "HELD"})


def fill_the_gate():
    """Two holders of project p9 fill the global cap of 2; p1's project counter does not exist."""
    holders = [leases.acquire(lease_request(project="p9", user=u)) for u in ("x1", "x2")]
    assert stored(GATE)["count"] == 2 and not stored(P1)
    return holders


def lower_p1():
    """p1's project counter, left idle by the waiters' first attempts, is dropped by reconcile
    (its safety margin passes during a long wait), then p1's project layer lowers its project
    cap from 2 to 1 (the write stamps what exists)."""
    sweeps.reconcile(now=store.server_now() + timedelta(milliseconds=50), safety_ms=0)
    assert stored(GATE)["queue"] and not stored(P1)
    define("res", "levels: {project: 1}", tenant="acme", project="p1")
    assert not stored(P1), "the counter must not exist at the stamp"


@pytest.mark.parametrize("direct", [True, False], ids=["granted-from-lv", "booking-itself"])
def test_given_waiters_queued_before_a_lowering_when_granted_then_the_new_narrow_counter_obeys_the_new_cap(
        direct, monkeypatch):
    if not direct:  # a pick the freeing process only wakes: the waiter books from its own view
        from leases.queue import grants

        monkeypatch.setattr(grants, "grantable", lambda ticket, now: False)
    define("res", "levels: {global: 2, project: 2}\nwaitMs: 60000\nttlSeconds: 60")
    holders = fill_the_gate()
    # given: two blocking acquires of p1 wait in the queue with the view of cap 2
    waiters = [queue_up(lease_request(user=u, wait_ms=1500), GATE) for u in ("u1", "u2")]
    # when: p1's project cap is lowered to 1, then both gate slots free
    lower_p1()
    for lease in holders:
        lease.release()
    # then: one of them is granted; the other is not (it ends Busy at its wait bound)
    for waiter in waiters:
        waiter.join(10)
    granted = [w.lease for w in waiters if w.lease is not None]
    assert (len(granted), stored(P1)["count"], stored(P1)["cap"]) == (1, 1, 1), ([w.error for w in waiters], stored(P1))
    assert wait_for(lambda: held_in_p1() == 1, 5)  # claimed in the background
    for lease in granted:
        lease.release()


def test_given_kept_tickets_queued_before_a_lowering_when_granted_and_polled_then_the_new_cap_binds():
    define("res", "levels: {global: 2, project: 2}\nwaitMs: 60000\nttlSeconds: 60")
    holders = fill_the_gate()
    # given: two HTTP-style kept tickets of p1, their lv carrying the project cap of 2
    tickets = [service.acquire_or_ticket(lease_request(user=u, wait_ms=0), keep_ms=30000) for u in ("u1", "u2")]
    assert all(isinstance(t, service.Ticket) for t in tickets)
    assert [lv["c"] for t in stored(GATE)["queue"] for lv in t["lv"]] == [2, 2]
    # when: p1's project cap is lowered to 1, then both gate slots free (each release
    # grants the next ticket and books its narrower levels from its lv), then both poll
    lower_p1()
    for lease in holders:
        lease.release()
    answers = [service.resume(t.id, scope=SCOPE, keep_ms=30000) for t in tickets]
    # then: one poll answers a lease, the other keeps waiting
    granted = [a for a in answers if isinstance(a, service.Lease)]
    assert (len(granted), held_in_p1(), stored(P1)["count"]) == (1, 1, 1), (answers, stored(P1))
    for lease in granted:
        lease.release()
    # and the one still waiting is granted once the slot is back (after it sits out the
    # pause of a ticket blocked at a narrower level), within the new cap
    waiting_id = next(t.id for t, a in zip(tickets, answers) if not isinstance(a, service.Lease))

    def granted_on_poll():
        answer = service.resume(waiting_id, scope=SCOPE, keep_ms=30000)
        return answer if isinstance(answer, service.Lease) else None

    later = wait_for(granted_on_poll, 10, step=0.1)
    assert isinstance(later, service.Lease) and stored(P1)["count"] == 1
    later.release()


def test_given_a_stamped_counter_dropped_idle_when_an_old_view_books_again_then_the_stamp_still_binds():
    define("res", "levels: {global: 9, project: 2}\nttlSeconds: 60")
    leases.acquire(lease_request(user="u0")).release()  # p1's project counter exists, idle
    old = definitions.load("res", "acme", "p1")  # a view from before the write (a stale cache)
    # when: the write lowers p1's project cap to 1 and stamps the idle counter
    define("res", "levels: {project: 1}", tenant="acme", project="p1")
    assert stored(P1)["capStamps"]["res"]["cap"] == 1
    # and reconcile drops it as idle (past the safety margin)
    sweeps.reconcile(now=store.server_now() + timedelta(seconds=5), safety_ms=0)
    assert not stored(P1), "the idle counter was not dropped"
    # then: two acquisitions from the old view (cap 2) book it once, not twice
    original = definitions.resolve
    definitions.resolve = lambda name, tenant, project: old
    try:
        first = leases.acquire(lease_request(user="u1", wait_ms=0))
        with pytest.raises(leases.LeaseBusy):
            leases.acquire(lease_request(user="u2", wait_ms=0))
    finally:
        definitions.resolve = original
    assert (stored(P1)["count"], stored(P1)["cap"]) == (1, 1)
    first.release()


def test_given_a_counter_left_pending_when_bookings_find_it_at_one_then_they_settle_it_and_are_not_refused():
    """A counter is born bound to one slot until its creator stamps it from a fresh read: a
    booking that finds it so (a simultaneous first use, or a creator that stopped) settles it
    itself and books, instead of answering Busy."""
    define("res", "levels: {global: 9, project: 2}\nttlSeconds: 60")
    from leases.store import counter_commands

    # given: p1's project counter as a creator that died before settling it left it
    view = definitions.resolve("res", "acme", "p1")
    spec = next(s for s in view.level_specs("acme", "p1", "u1") if s.level == "project")
    seeded = counter_commands.seed(resource="res", level="project", scope=spec.scope, tenant_id="acme", cap=2,
                                   lease="res")
    store.counters().update_one(*counter_commands.create(P1, seeded), upsert=True)
    assert stored(P1)["cap"] == 1
    # then: two acquisitions take both slots
    a, b = leases.acquire(lease_request(user="u1")), leases.acquire(lease_request(user="u2"))
    assert (stored(P1)["count"], stored(P1)["cap"]) == (2, 2)
    a.release()
    b.release()


# --- the stamp pass against a concurrent creation (forced interleavings) ----------------------


def acquire_with(view, request):
    """Acquire as a process whose cache still serves ``view`` (loaded before a write)."""
    original = definitions.resolve
    definitions.resolve = lambda name, tenant, project: view
    try:
        return leases.acquire(request)
    finally:
        definitions.resolve = original


def test_given_an_old_view_creating_the_counter_after_the_stamp_pass_looked_then_the_write_still_binds_it(monkeypatch):
    from leases.definitions import caps

    define("res", "levels: {global: 9, project: 2, user: 5}\nttlSeconds: 60")
    leases.acquire(lease_request(project="p9", user="x")).release()  # the pass has a counter to look at: x's
    old = definitions.load("res", "acme", "p1")
    real, created, started = caps._cap, [], []

    def in_the_pass(views, counter):
        # The write's stamp pass has listed the counters (p1's is not among them): now an old
        # view creates p1's, before the pass stamps anything and the write returns.
        if not started:
            started.append(True)  # once (the creator's settle calls it too)
            created.append(acquire_with(old, lease_request(user="u1", wait_ms=0)))
        return real(views, counter)

    monkeypatch.setattr(caps, "_cap", in_the_pass)
    define("res", "levels: {project: 1}", tenant="acme", project="p1")
    monkeypatch.setattr(caps, "_cap", real)
    assert created and (stored(P1)["count"], stored(P1)["cap"]) == (1, 1)
    # then: after the write returned, another booking from the old view is refused
    with pytest.raises(leases.LeaseBusy):
        acquire_with(old, lease_request(user="u2", wait_ms=0))
    created[0].release()


def test_given_a_write_between_a_settles_read_and_its_stamp_then_the_settle_does_not_undo_the_writes_stamp(monkeypatch):
    from leases.store import counter_commands

    define("res", "levels: {global: 9, project: 2}\nttlSeconds: 60")
    old = definitions.load("res", "acme", "p1")
    real = counter_commands.settle_cap

    def after_the_read(key, lease, cap):
        # The creator read the definition (cap 2); a write lowers it and stamps the pending
        # counter before the creator's stamp lands.
        if key == P1:
            define("res", "levels: {project: 1}", tenant="acme", project="p1")
        return real(key, lease, cap)

    monkeypatch.setattr(counter_commands, "settle_cap", after_the_read)
    first = leases.acquire(lease_request(user="u1", wait_ms=0))
    monkeypatch.setattr(counter_commands, "settle_cap", real)
    # then: the write's cap stands, and binds the old view
    assert (stored(P1)["count"], stored(P1)["cap"], stored(P1)["capStamps"]["res"]["cap"]) == (1, 1, 1)
    with pytest.raises(leases.LeaseBusy):
        acquire_with(old, lease_request(user="u2", wait_ms=0))
    first.release()


def test_given_a_creator_that_stopped_before_settling_then_its_counters_run_at_one_until_reconcile_settles_them(
        monkeypatch):
    from leases.definitions import caps

    define("res", "levels: {global: 3, project: 2}\nttlSeconds: 60")
    # given: the first booking created both counters and stopped before its settle
    monkeypatch.setattr(caps, "settle", lambda specs, resource: 0)
    first = leases.acquire(lease_request(user="u1"))
    assert (stored(P1)["cap"], stored(GATE)["cap"]) == (1, 1)
    monkeypatch.undo()
    # when: reconcile runs past the safety margin
    sweeps.reconcile(now=store.server_now() + timedelta(milliseconds=50), safety_ms=0)
    # then: both carry the caps of a fresh read (a plain stamp now), and a second booking fits
    assert (stored(P1)["cap"], stored(GATE)["cap"]) == (2, 3)
    assert stored(P1)["capStamps"]["res"]["at"].year < 9999
    second = leases.acquire(lease_request(user="u2", wait_ms=0))
    first.release()
    second.release()


def test_given_a_first_use_async_then_its_creator_settles_the_counters_it_created():
    from tests.engine.test_aio import run

    define("res", "levels: {global: 3, project: 2}\nttlSeconds: 60")

    async def first_use():
        lease = await leases.aacquire(lease_request(user="u1"))
        await lease.arelease()

    run(first_use())
    assert (stored(P1)["cap"], stored(GATE)["cap"]) == (2, 3)
    assert stored(P1)["capStamps"]["res"]["at"].year < 9999
