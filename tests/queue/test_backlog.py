"""The backlog (leases.queue.backlog): a long queue keeps only its head in the gate document."""

from __future__ import annotations

import time
from datetime import timedelta
from functools import partial

import pytest

import leases
from leases.queue import backlog
from leases.store import client as store
from tests import helpers
from tests.helpers import define, lease_request, quiet_handler_fixture, wait_for

handler = quiet_handler_fixture("test")
req = partial(lease_request, pod="")
GATE = "res|global|*"


def gate_doc():
    return store.counters().find_one({"_id": GATE}) or {}


def waiting_ids():
    return set(helpers.queued_ids(GATE)) | {d["_id"] for d in store.tickets().find({"g": GATE}, {"_id": 1})}


def line_up(request):
    """A waiter for ``request``, returned once its ticket waits (in the head or the backlog)."""
    before = waiting_ids()
    waiter = helpers.Waiter(request)
    waiter.start()
    new = wait_for(lambda: waiting_ids() - before, 10, step=0.01)
    assert new, "the waiter never queued"
    (waiter.ticket,) = new
    return waiter


def behind_a_head_of_two(settings, waiters):
    """A held cap 1 with a head of two tickets and a promotion's bound of 0.6 s: the holder,
    and ``waiters`` lined up (those past two wait in the backlog)."""
    settings.LEASES_QUEUE_HEAD = 2
    settings.LEASES_MONGO_TIMEOUT_MS = 300  # a promotion's bound: 0.6 s
    define("res", "levels: {global: 1}\nwaitMs: 30000")
    held = leases.acquire(req(tenant="h", user="h"))
    return held, [line_up(req(tenant="a", user=f"a{i}")) for i in range(waiters)]


def test_given_more_waiters_than_the_head_then_the_gate_holds_the_head_and_a_later_tenant_is_not_behind_the_backlog(
        settings):
    # Given: a head of 2 tickets; tenant a queues four, then tenant b two, on a held cap 1.
    settings.LEASES_QUEUE_HEAD = 2
    define("res", "levels: {global: 1}\nwaitMs: 30000")
    held = leases.acquire(req(tenant="h", user="h"))
    waiters = [line_up(req(tenant="a", user=f"a{i}")) for i in range(4)]
    waiters += [line_up(req(tenant="b", user=f"b{i}")) for i in range(2)]
    # Then: the gate document holds two tickets and counts four in the backlog (the count is
    # the ticket's second write: the last one may land a moment after its ticket shows).
    gate = wait_for(lambda: (lambda g: g if g.get("bk") == 4 else None)(gate_doc()), 5, step=0.01) or gate_doc()
    assert [t["t"] for t in gate["queue"]] == ["a", "a"] and gate["bk"] == 4
    assert store.tickets().count_documents({"g": GATE}) == 4
    # When: every lease is released as soon as it is granted.
    held.release()
    order = helpers.release_as_granted(waiters)
    # Then: all six are granted in turn, and tenant b's first grant does not wait behind the
    # backlog of tenant a (it comes within the first three), the backlog empties.
    tenants = [w.request.tenant_id for w in order]
    assert sorted(tenants) == ["a"] * 4 + ["b"] * 2
    assert "b" in tenants[:3], tenants
    assert store.tickets().count_documents({"g": GATE}) == 0
    assert backlog.count(gate_doc()) == 0


def test_given_a_waiter_in_the_backlog_when_its_wait_ends_then_it_leaves_the_backlog_and_is_busy(settings):
    settings.LEASES_QUEUE_HEAD = 2
    define("res", "levels: {global: 1}\nwaitMs: 30000")
    held = leases.acquire(req(user="h"))
    waiters = [line_up(req(user=f"w{i}")) for i in range(2)]
    try:
        with pytest.raises(leases.LeaseBusy) as refused:
            leases.acquire(req(user="late", wait_ms=1500))
        assert refused.value.queue_full is False
        assert store.tickets().count_documents({"g": GATE}) == 0
        assert backlog.count(gate_doc()) == 0
        assert store.holders().count_documents({"userId": "late"}) == 0
    finally:
        held.release()
        for waiter in waiters:
            waiter.join(20)
            assert waiter.lease is not None, waiter.error
            waiter.lease.release()


def test_given_tickets_in_the_backlog_then_lease_waiters_lists_them_after_the_head_and_a_tenant_sees_only_its_own(
        settings):
    from leases.ops.reads.waiters import list_waiters

    settings.LEASES_QUEUE_HEAD = 2
    define("res", "levels: {global: 1}\nwaitMs: 30000")
    held = leases.acquire(req(tenant="h", user="h"))
    waiters = [line_up(req(tenant="a", user=f"a{i}")) for i in range(3)] + [line_up(req(tenant="b", user="b0"))]
    try:
        everyone = list_waiters()
        assert [(w.tenant_id, w.position) for w in everyone.items] == [("a", 1), ("a", 2), ("a", 3), ("b", 4)]
        mine = list_waiters(tenant_id="b")
        assert [(w.tenant_id, w.user_id, w.position) for w in mine.items] == [("b", "b0", 4)]
    finally:
        held.release()
        helpers.release_as_granted(waiters)


def test_given_a_kept_ticket_in_the_backlog_then_its_polls_place_it_after_the_head_and_it_is_granted_in_turn(settings):
    from leases import service

    settings.LEASES_QUEUE_HEAD = 2
    define("res", "levels: {global: 1}\nwaitMs: 30000")
    scope = {"tenantId": "acme"}
    held = leases.acquire(req(user="h"))
    waiters = [line_up(req(user=f"w{i}")) for i in range(2)]
    # When: an HTTP client's request queues behind the full head, its ticket kept for polls.
    ticket = service.acquire_or_ticket(req(user="k", wait_ms=0), keep_ms=5000)
    # Then: it waits in the backlog, third in line, alive to its poll deadline.
    assert isinstance(ticket, service.Ticket)
    assert store.tickets().count_documents({"_id": ticket.id}) == 1
    assert ticket.position == 3 and ticket.deadline > ticket.server_time
    polled = service.resume(ticket.id, scope=scope, keep_ms=5000)
    assert isinstance(polled, service.Ticket) and polled.position == 3
    # When: the two ahead are granted and released: then a poll claims its lease.
    held.release()
    helpers.release_as_granted(waiters)
    lease = wait_for(lambda: (lambda r: r if isinstance(r, service.Lease) else None)(
        service.resume(ticket.id, scope=scope, keep_ms=5000)), 15, step=0.2)
    assert lease is not None
    assert lease.release() is True
    assert store.tickets().count_documents({}) == 0


def test_given_a_backlog_hint_older_than_its_gate_when_a_request_waits_then_the_gate_is_made_and_counts_it(settings):
    # Given: this process saw the gate's backlog in use a moment ago (its hint lives a second),
    # and the gate document is gone since (deleted, as between two tests, or by an operator).
    from leases.queue import waiting

    settings.LEASES_QUEUE_HEAD = 2
    define("res", "levels: {global: 1}\nwaitMs: 30000")
    waiting.note_queue({"_id": GATE, "queue": [], "bk": 3})
    assert waiting.backlog_likely(GATE) and store.counters().find_one({"_id": GATE}) is None
    # When: a request finds the cap held and waits.
    held = leases.acquire(req(tenant="h", user="h"))
    waiter = line_up(req(tenant="a", user="a0"))
    try:
        # Then: it waits on a gate that exists and knows it (it used to be placed in the backlog
        # of no gate, counted nowhere, and its waiter failed on the stand-in it got back).
        gate = gate_doc()
        queued = [t["id"] for t in gate.get("queue") or ()]
        backlogged = [d["_id"] for d in store.tickets().find({"g": GATE}, {"_id": 1})]
        assert waiter.ticket in queued or (waiter.ticket in backlogged and gate.get("bk") == 1), (queued, gate)
        assert waiter.is_alive() and waiter.error is None
    finally:
        held.release()
    waiter.join(10)
    assert waiter.lease is not None, waiter.error
    waiter.lease.release()


def test_given_newcomers_arriving_together_at_a_deep_queue_then_they_share_their_writes_and_each_waits_and_is_granted_in_turn(
        settings, monkeypatch):
    # Given: a held cap 1 whose head (2) is full and whose backlog this process has seen.
    from leases.engine import funnel

    settings.LEASES_QUEUE_HEAD = 2
    define("res", "levels: {global: 1}\nwaitMs: 30000")
    held = leases.acquire(req(tenant="h", user="h"))
    waiters = [line_up(req(tenant="a", user=f"a{i}")) for i in range(3)]
    assert wait_for(lambda: backlog.count(gate_doc()) == 1, 5, step=0.01)
    # The first holder write of the burst is held in flight until the other newcomers wait
    # behind it, so that they go together (as threads of a busy process do).
    sizes: list[int] = []
    real = funnel.holders_together
    burst = 8

    def holders_together(upserts):
        sizes.append(len(upserts))
        if len(sizes) == 1:
            wait_for(lambda: len(sizes) > 1 or _pending_holders() == burst - 1, 10, step=0.01)
        return real(upserts)

    monkeypatch.setattr(funnel, "holders_together", holders_together)
    # When: eight newcomers of tenant b arrive together.
    from leases.queue import waiting

    before = waiting_ids()
    burst_waiters = [helpers.Waiter(req(tenant="b", user=f"b{i}")) for i in range(burst)]
    waiting.note_queue(gate_doc())  # seen a moment ago (a loaded machine may have let a second pass)
    for waiter in burst_waiters:
        waiter.start()
    wait_for(lambda: len(waiting_ids() - before) == burst, 15, step=0.02)
    # Then: their holders went in two writes (the first alone, the seven after it together),
    # each holder is its own, and the backlog counts every ticket it holds.
    assert sizes == [1, burst - 1]
    tokens = waiting_ids() - before
    docs = list(store.holders().find({"_id": {"$in": list(tokens)}}, {"state": 1, "acquiredAt": 1, "expiresAt": 1}))
    assert len(docs) == burst and all(d["state"] == "PENDING" and d["expiresAt"] > d["acquiredAt"] for d in docs)
    # (The count is the tickets' second write: it may land a moment after they show.)
    assert wait_for(lambda: backlog.count(gate_doc()) == 1 + burst, 5, step=0.01)
    assert store.tickets().count_documents({"g": GATE}) == 1 + burst
    # When: every lease is released as soon as it is granted. Then: all are granted, once each.
    held.release()
    order = helpers.release_as_granted(waiters + burst_waiters)
    assert len(order) == 3 + burst and len({id(w) for w in order}) == 3 + burst
    assert store.tickets().count_documents({"g": GATE}) == 0


def _pending_holders() -> int:
    from leases.store import batches

    with batches._lock:
        return sum(len(batch.items) for batch in batches._open.get("holders", ()))


def test_given_a_newcomer_let_go_without_a_step_turn_when_the_backlog_hint_lapsed_meanwhile_then_it_still_only_writes_its_holder():
    # Given: a gate with free slots and no hint at all (the hint that let the step go without a
    # turn lapsed before it ran: a loaded process, a second gone).
    from leases import service
    from leases.engine import funnel

    define("res", "levels: {global: 2}\nwaitMs: 30000")
    attempt, wait_ms = service.prepare(req(tenant="a", user="a"))
    # When: its first step runs as chosen, bound for the backlog.
    with helpers.counted_commands() as counter:
        result = funnel.first(attempt, allow_queue=True, wait_ms=wait_ms, deep=True)
    # Then: it wrote its holder (covering its wait) and nothing else — no booking on the gate,
    # which many such steps at once, with no turn to bound them, would send together.
    assert isinstance(result, funnel._Blocked)
    assert counter.commands == ["findAndModify"]
    doc = store.holders().find_one({"_id": attempt.token})
    assert doc["state"] == "PENDING" and doc["expiresAt"] - doc["acquiredAt"] > timedelta(seconds=wait_ms / 1000 - 1)
    assert (gate_doc() or {}).get("count", 0) == 0
    attempt.rollback()


def test_given_a_promotion_between_its_delete_and_its_push_then_the_waiter_keeps_its_place_until_it_has_ended(settings):
    # Given: a ticket of this process in the backlog (head of 2, held cap 1).
    from leases.queue import waiting

    held, waiters = behind_a_head_of_two(settings, 3)
    (back,) = [d["_id"] for d in store.tickets().find({"g": GATE}, {"_id": 1})]
    assert backlog.placed(back, GATE)
    # When: a promotion has claimed the gate and taken the ticket out of the backlog, its push
    # into the head not landed yet.
    store.counters().update_one({"_id": GATE}, {"$currentDate": {"promotedAt": True}})
    doc = store.tickets().find_one_and_delete({"_id": back})
    kept = backlog.verify(GATE, [back], lambda: waiting.read_gate(GATE))
    # Then: the ticket is kept as placed (its waiter does not queue a second ticket under its
    # token, which a grant would later find over) ...
    assert back in kept and backlog.placed(back, GATE)
    # ... and once the push lands, it is in the head and forgotten as placed.
    store.counters().update_one({"_id": GATE}, {"$push": {"queue": doc["ticket"]}, "$inc": {"bk": -1}})
    assert backlog.verify(GATE, [back], lambda: waiting.read_gate(GATE)) == set()
    assert not backlog.placed(back, GATE)
    held.release()
    helpers.release_as_granted(waiters)
    assert store.tickets().count_documents({"g": GATE}) == 0


def test_given_a_ticket_missing_from_the_backlog_past_the_promotion_bound_then_it_is_forgotten(settings):
    # A promotion that died between its delete and its push: the ticket is not kept for ever
    # (its waiter is nudged and queues again).
    from leases.queue import waiting

    held, waiters = behind_a_head_of_two(settings, 3)
    (back,) = [d["_id"] for d in store.tickets().find({"g": GATE}, {"_id": 1})]
    store.counters().update_one({"_id": GATE}, {"$currentDate": {"promotedAt": True}})
    store.tickets().delete_one({"_id": back})
    assert back in backlog.verify(GATE, [back], lambda: waiting.read_gate(GATE))
    with backlog._lock:  # found missing a bound ago (not slept: the watcher would act meanwhile)
        backlog._missing[back] -= backlog.promotion_bound().total_seconds()
    assert backlog.verify(GATE, [back], lambda: waiting.read_gate(GATE)) == set()
    assert not backlog.placed(back, GATE)
    held.release()
    helpers.release_as_granted(waiters)


def test_given_a_promotion_under_way_past_the_throttle_then_no_second_one_starts_until_it_ends_or_its_bound(settings):
    # Given: two tickets in the backlog behind a head of two (held cap 1), and a promotion
    # claimed on the gate that is still under way (its promoter slow: commands of a loaded
    # store take hundreds of ms), claimed longer ago than the throttle.
    from leases.queue import waiting

    held, waiters = behind_a_head_of_two(settings, 4)
    assert wait_for(lambda: store.tickets().count_documents({"g": GATE}) == 2, 5, step=0.01)
    store.counters().update_one({"_id": GATE}, {"$currentDate": {"promotedAt": True},
                                                "$set": {backlog.PROMOTING: True}})
    settings.LEASES_QUEUE_HEAD = 4  # room in the head: a promotion is due
    time.sleep(backlog.PROMOTE_EVERY.total_seconds() + 0.1)
    # When: another promoter (this test, and this process's watcher) looks at the gate.
    # Then: it does not promote while the first may still be moving tickets ...
    assert backlog.promote(waiting.read_gate(GATE), force=True) is None
    assert store.tickets().count_documents({"g": GATE}) == 2
    # ... and once the first's bound has passed (it died), the tickets are promoted.
    assert wait_for(lambda: store.tickets().count_documents({"g": GATE}) == 0 or backlog.promote(
        waiting.read_gate(GATE), force=True) and False, 5, step=0.05)
    assert store.tickets().count_documents({"g": GATE}) == 0 and len(gate_doc()["queue"]) == 4
    assert backlog.PROMOTING not in gate_doc()
    held.release()
    helpers.release_as_granted(waiters)


def test_given_more_tickets_of_this_process_in_the_backlog_than_a_first_batch_then_checking_them_is_one_command():
    # Given: 150 tickets this process placed in a gate's backlog (a cursor's first batch is 101).
    from leases.queue import waiting

    define("res", "levels: {global: 1}\nwaitMs: 30000")
    held = leases.acquire(req(tenant="h", user="h"))
    now = store.server_now()
    docs = {f"t{i:03d}": {"_id": f"t{i:03d}", "g": GATE, "at": now, "ticket": {"id": f"t{i:03d}", "at": now}}
            for i in range(150)}
    backlog._place(GATE, docs)
    try:
        # When: the watcher checks they still wait there.
        with helpers.counted_commands() as counter:
            there = backlog.verify(GATE, list(docs), lambda: waiting.read_gate(GATE))
        # Then: all are there, told in one reply.
        assert there == set(docs) and counter.commands == ["find"], counter.commands
    finally:
        for ticket_id in docs:
            backlog.forget(ticket_id)
        held.release()


def test_given_no_promotion_since_the_last_check_then_checking_this_process_tickets_reads_nothing_and_after_one_it_reads():
    # Given: three tickets of this process in a gate's backlog, checked once on the gate as read.
    from leases.queue import waiting

    define("res", "levels: {global: 1}\nwaitMs: 30000")
    held = leases.acquire(req(tenant="h", user="h"))
    now = store.server_now()
    docs = {f"q{i}": {"_id": f"q{i}", "g": GATE, "at": now, "ticket": {"id": f"q{i}", "at": now}} for i in range(3)}
    backlog._place(GATE, docs)
    try:
        assert backlog.verify(GATE, list(docs), lambda: waiting.read_gate(GATE), waiting.read_gate(GATE)) == set(docs)
        # When: the watcher checks them again, no promotion having begun since.
        with helpers.counted_commands() as counter:
            there = backlog.verify(GATE, list(docs), lambda: waiting.read_gate(GATE), waiting.read_gate(GATE))
        # Then: only the gate's read (the watcher's own) was sent; all are still there.
        assert there == set(docs) and counter.commands == ["aggregate"], counter.commands
        # When: a promotion took one (long ago: it has ended); then the check reads and forgets it.
        store.tickets().delete_one({"_id": "q0"})
        store.counters().update_one({"_id": GATE}, {"$set": {"promotedAt": now - timedelta(hours=1)}})
        assert backlog.verify(GATE, list(docs), lambda: waiting.read_gate(GATE), waiting.read_gate(GATE)) == {"q1", "q2"}
        assert not backlog.placed("q0", GATE)
    finally:
        for ticket_id in docs:
            backlog.forget(ticket_id)
        held.release()
