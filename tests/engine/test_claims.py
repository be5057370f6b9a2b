"""A grant claimed in the background (``leases.engine.claims``): the waiter returns at once,
told the deadline it has for sure; a claim that comes too late loses the lease, never the cap."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from functools import partial

import pymongo.errors
import pytest

import leases
from leases.engine import claims
from leases.engine.funnel import Attempt
from leases.errors import LeaseExpired
from leases.queue import grants, waiting
from leases.store import client as store, entries
from tests import helpers
from tests.faults import quiet_waiter
from tests.helpers import define, lease_request, quiet_handler_fixture

handler = quiet_handler_fixture("test")
req = partial(lease_request, pod="")
GATE = "res|global|*"


@pytest.fixture
def one_slot(settings):
    define("res", "levels: {global: 1}\nwaitMs: 10000\nttlSeconds: 60")
    return settings


@pytest.fixture
def timer_held(monkeypatch):
    """The claim timer never fires by itself: the marks it was given wait in the returned
    list until the test sends them (``claim.send()``, what the timer does when one is due),
    so "not due yet" does not depend on how fast the machine is."""
    due: list = []

    class Held:
        def at(self, when, claim):
            due.append(claim)

    monkeypatch.setattr(claims._timer, "get", lambda: Held())
    return due


@pytest.fixture
def held_back(monkeypatch):
    """Claims sent from the claim thread wait until the test sets the returned event."""
    go = threading.Event()
    mark = claims.PendingClaim._mark

    def slow(self, background):
        if background:
            assert go.wait(30), "the test never let the claim go"
        return mark(self, background)

    monkeypatch.setattr(claims.PendingClaim, "_mark", slow)
    yield go
    go.set()


def queue_up(settings, request):
    """A waiter queued at the full gate that learns of its grant from the wake-up only: no
    keep-alive poll and no repair of its own within the test (:func:`tests.faults.quiet`) —
    on a loaded machine either may come first and claim the grant from the gate itself,
    leaving no claim in the background to look at."""
    return quiet_waiter(settings, request, GATE)


def handed_over(settings):
    """A waiter queued behind a holder, granted by the holder's release: its lease."""
    held = leases.acquire(req(user="h"))
    waiter = queue_up(settings, req(user="w"))
    held.release()
    waiter.join(10)
    return waiter.lease


def gate_tokens():
    return [entries.token_of(e) for e in (store.counters().find_one({"_id": GATE}) or {}).get("holders") or ()]


def test_given_a_granted_waiter_then_it_returns_before_its_holder_is_marked_and_is_told_the_claim_window(
        one_slot, held_back):
    # Given: a waiter queued behind a holder; its claim thread is held back.
    held = leases.acquire(req(user="h"))
    waiter = queue_up(one_slot, req(user="w"))
    # When: the holder releases.
    held.release()
    waiter.join(10)
    # Then: the acquire returned while the holder is still PENDING, with the slot booked for
    # it, told the deadline it has for sure: the grant's time plus the claim window.
    lease = waiter.lease
    assert lease is not None and gate_tokens() == [lease.token]
    assert store.holders().find_one({"_id": lease.token})["state"] == "PENDING"
    assert lease.expires_at == lease.last_seen_at + timedelta(milliseconds=grants.claim_ms())
    # When: the claim goes; then the holder is HELD, the lease told the TTL's deadline.
    held_back.set()
    lease.wait_claimed()
    holder = store.holders().find_one({"_id": lease.token})
    assert holder["state"] == "HELD" and lease.expires_at == holder["expiresAt"]
    assert holder["expiresAt"] == lease.last_seen_at + timedelta(seconds=60)
    lease.check()
    assert lease.release() is True and gate_tokens() == []


def test_given_a_claim_later_than_its_window_then_the_slot_goes_on_and_the_lease_is_lost_never_doubled(
        one_slot, held_back, settings):
    # Given: a short claim window, a polling follower, and a granted waiter whose claim stalls.
    settings.LEASES_GRANT_CLAIM_MS = 200
    settings.LEASES_WAIT_POLL_MS = 100
    settings.LEASES_REPAIR_INTERVAL_MS = 100
    held = leases.acquire(req(user="h"))
    late = helpers.queue_up(req(user="late"), GATE)
    follower = helpers.queue_up(req(user="f"), GATE)
    held.release()
    late.join(10)
    assert late.lease is not None
    told_until = late.lease.expires_at
    # When: the window passes; the follower's repair ends the unclaimed grant (no handler: it
    # was never HELD) and takes the slot.
    follower.join(10)
    assert follower.lease is not None and gate_tokens() == [follower.lease.token]
    assert store.holders().find_one({"_id": late.lease.token}) is None
    # The late lease was told a deadline that ended before the follower's grant.
    assert told_until <= follower.lease.last_seen_at
    # Then: once its claim runs, the late lease is lost: its check fails, and it stays lost.
    held_back.set()
    with pytest.raises(LeaseExpired) as lost:
        late.lease.check()
    assert lost.value.reason == "unclaimed"
    with pytest.raises(leases.LeaseLost):
        late.lease.check()
    # Its release returns nothing twice: the gate still books the follower alone.
    assert late.lease.release() is False
    assert gate_tokens() == [follower.lease.token]
    assert store.counters().find_one({"_id": GATE})["count"] == 1
    follower.lease.release()
    assert gate_tokens() == []


def test_given_the_store_failing_the_background_claim_then_the_next_call_claims_again(one_slot, monkeypatch):
    # Given: the claim thread's mark fails once as if the store dropped the connection.
    claim = Attempt.claim
    failures = []

    def flaky(self, booking, fence, at=None):
        if threading.current_thread().name.startswith("leases-claim") and not failures:
            failures.append(booking)
            raise pymongo.errors.AutoReconnect("connection closed")
        return claim(self, booking, fence, at)

    monkeypatch.setattr(Attempt, "claim", flaky)
    held = leases.acquire(req(user="h"))
    waiter = queue_up(one_slot, req(user="w"))
    held.release()
    waiter.join(10)
    assert waiter.lease is not None
    # The mark is due after its share of the claim window; it fails there.
    assert helpers.wait_for(lambda: failures, 10, step=0.01)
    # When: the holder checks; then that call claims again, and the lease is held.
    waiter.lease.check()
    assert failures and store.holders().find_one({"_id": waiter.lease.token})["state"] == "HELD"
    assert waiter.lease.release() is True and gate_tokens() == []


def async_handed_over(settings):
    """An async waiter granted by a release's hand-off, told of it by the wake-up only
    (:func:`tests.faults.quiet`): its lease, answered (the waiter ran its own event loop in a
    thread)."""
    import asyncio

    from tests.faults import quiet

    async def wait_async():
        return await leases.aacquire(req(user="a"))

    held = leases.acquire(req(user="h"))
    quiet(settings, GATE)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("lease", asyncio.run(wait_async())), daemon=True)
    thread.start()
    assert helpers.wait_for(lambda: helpers.queued_ids(GATE), 10, step=0.01)
    held.release()
    thread.join(10)
    return result["lease"]


def test_given_an_async_waiter_granted_by_a_hand_off_then_it_is_answered_before_its_mark_and_a_check_waits_for_it(
        one_slot, monkeypatch, timer_held):
    # Given: the claim timer held back, so the mark is not due until the test says.
    import asyncio

    sent = counted_claims(monkeypatch)
    # When: an async waiter is granted by a release's hand-off.
    lease = async_handed_over(one_slot)
    # Then: it was answered with its mark still to come (the claim off the hand-off's path),
    # and a check sends the mark first: the holder is HELD, the lease renewed.
    assert sent == [] and len(timer_held) == 1
    assert store.holders().find_one({"_id": lease.token})["state"] == "PENDING"
    asyncio.run(lease.acheck())
    assert sent == [lease.token] and store.holders().find_one({"_id": lease.token})["state"] == "HELD"
    assert asyncio.run(lease.arelease()) is True
    assert gate_tokens() == [] and waiting.is_full(store.counters().find_one({"_id": GATE})) is False


def test_given_an_async_grant_released_before_its_mark_is_due_then_no_mark_is_ever_sent(
        one_slot, monkeypatch, timer_held):
    import asyncio

    sent = counted_claims(monkeypatch)
    lease = async_handed_over(one_slot)
    # When: it releases before its mark is due.
    assert asyncio.run(lease.arelease()) is True
    # Then: the holder ended as it was, its slot came back, and when the mark's time comes
    # none is sent.
    assert gate_tokens() == [] and store.holders().find_one({"_id": lease.token}) is None
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "release"
    timer_held[0].send()
    time.sleep(0.2)
    assert lease.token not in sent and timer_held[0].future is None
    assert asyncio.run(lease.arelease()) is False


def counted_claims(monkeypatch):
    """The marks sent (from any thread), as the tokens they named."""
    claim = Attempt.claim
    sent: list[str] = []

    def counting(self, booking, fence, at=None):
        sent.append(self.token)
        return claim(self, booking, fence, at)

    monkeypatch.setattr(Attempt, "claim", counting)
    return sent


def test_given_a_grant_released_before_its_mark_is_due_then_no_mark_is_ever_sent(
        one_slot, monkeypatch, settings, timer_held):
    # Given: a granted waiter that holds its lease a moment, shorter than the mark's delay.
    sent = counted_claims(monkeypatch)
    settings.LEASES_GRANT_MARK_DELAY_MS = 250
    lease = handed_over(one_slot)
    assert lease is not None and store.holders().find_one({"_id": lease.token})["state"] == "PENDING"
    # When: it releases before its mark is due.
    assert lease.release() is True
    # Then: the holder ended as it was, its slot came back, it was tombstoned as released,
    # and even after the mark's time has passed no mark was sent for it.
    assert gate_tokens() == [] and store.holders().find_one({"_id": lease.token}) is None
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "release"
    assert len(timer_held) == 1
    timer_held[0].send()  # its time comes
    time.sleep(0.2)
    assert lease.token not in sent and timer_held[0].future is None
    assert lease.release() is False


def test_given_a_grant_held_past_its_mark_delay_then_the_background_marks_it_held(one_slot, monkeypatch):
    # Given: a granted waiter that keeps its lease and makes no call.
    sent = counted_claims(monkeypatch)
    lease = handed_over(one_slot)
    assert lease is not None
    # When: its share of the claim window passes; then the holder is HELD without any call,
    # well inside the window, and the lease is told the TTL's deadline.
    assert helpers.wait_for(lambda: store.holders().find_one({"_id": lease.token, "state": "HELD"}), 10, step=0.01)
    assert sent == [lease.token]
    assert helpers.wait_for(lambda: lease.expires_at == lease.last_seen_at + timedelta(seconds=60), 5, step=0.01)
    lease.check()
    assert sent == [lease.token] and lease.release() is True and gate_tokens() == []


def test_given_a_check_before_the_mark_is_due_then_the_check_marks_it_first(
        one_slot, monkeypatch, settings, timer_held):
    # Given: a granted waiter whose mark is not due yet.
    sent = counted_claims(monkeypatch)
    settings.LEASES_GRANT_MARK_DELAY_MS = 250
    lease = handed_over(one_slot)
    assert lease is not None and sent == []
    # When: it checks; then that call marked it (once, the timer never sends it again).
    lease.check()
    assert sent == [lease.token]
    assert store.holders().find_one({"_id": lease.token})["state"] == "HELD"
    assert len(timer_held) == 1
    timer_held[0].send()  # its time comes
    time.sleep(0.2)
    assert sent == [lease.token]
    assert lease.release() is True and gate_tokens() == []


def test_given_no_mark_delay_then_the_mark_is_sent_at_once(one_slot, monkeypatch, settings):
    # Given: LEASES_GRANT_MARK_DELAY_MS = 0 (every grant marked at once, as before the delay).
    sent = counted_claims(monkeypatch)
    settings.LEASES_GRANT_MARK_DELAY_MS = 0
    lease = handed_over(one_slot)
    assert lease is not None
    # When: it releases at once; then its mark had been sent all the same, and the slot is back.
    assert helpers.wait_for(lambda: sent == [lease.token], 5, step=0.005)
    assert lease.release() is True and gate_tokens() == []


def test_given_a_mark_under_way_when_the_lease_is_released_then_the_release_waits_for_none(
        one_slot, monkeypatch, settings):
    # Given: a granted waiter whose mark was sent at once and is held in flight, past the
    # point where it could still see the release coming.
    settings.LEASES_GRANT_MARK_DELAY_MS = 0
    go, inside = threading.Event(), threading.Event()
    claim = Attempt.claim

    def in_flight(self, booking, fence, at=None):
        if threading.current_thread().name.startswith("leases-claim"):
            inside.set()
            assert go.wait(30), "the test never let the mark go"
        return claim(self, booking, fence, at)

    monkeypatch.setattr(Attempt, "claim", in_flight)
    lease = handed_over(one_slot)
    assert lease is not None and inside.wait(10)
    pending = lease.pending_claim
    assert pending is not None and pending.future is not None and not pending.future.done()
    # When: it releases while the mark is under way.
    started = time.monotonic()
    assert lease.release() is True
    # Then: the release did not wait for the mark; the holder is gone and the slot is back.
    assert time.monotonic() - started < 2.0
    assert store.holders().find_one({"_id": lease.token}) is None and gate_tokens() == []
    # When the mark lands after the delete, it matches nobody: no holder comes back, it gives
    # nothing back (the count stays 0), and it says why: the tombstone's reason.
    go.set()
    assert helpers.wait_for(pending.future.done, 5, step=0.01)
    assert isinstance(pending.future.exception(), LeaseExpired)
    assert pending.future.exception().reason == "release"
    assert store.holders().find_one({"_id": lease.token}) is None
    gate = store.counters().find_one({"_id": GATE})
    assert gate["count"] == 0 and gate_tokens() == []


def test_given_a_mark_handed_to_a_claim_thread_when_the_release_comes_first_then_it_is_not_sent(
        one_slot, held_back, monkeypatch, settings):
    # Given: a granted waiter whose mark the timer handed to a claim thread, not yet running.
    settings.LEASES_GRANT_MARK_DELAY_MS = 0
    sent = counted_claims(monkeypatch)
    lease = handed_over(one_slot)
    assert lease is not None and lease.pending_claim is not None
    pending = lease.pending_claim
    # When: it releases first, then the claim thread runs.
    assert lease.release() is True
    held_back.set()
    # Then: the thread sends nothing; the slot is back.
    assert helpers.wait_for(pending.future.done, 5, step=0.01)
    assert pending.future.exception() is None and lease.token not in sent
    assert gate_tokens() == []
