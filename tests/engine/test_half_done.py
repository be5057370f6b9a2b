"""A command that half-succeeds (applied, its answer lost; or failed part-way) in a release or a
reap: never two leases on one slot, and a reap is never taken for its owner's release (issue 34,
items 1 and 8). Real server, real commands; only an answer is dropped (:mod:`tests.faults`)."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest

import leases
from leases.engine import holders
from leases.errors import LeaseBusy, LeaseLost, LeaseUnavailable
from leases.ops import actions
from leases.queue import waiting, wakeups
from leases.revocation import handlers
from leases.store import client as store, entries
from leases.upkeep import reaper
from tests.faults import answer_lost, quiet_waiter
from tests.helpers import RecordingHandler, define, lease_request

req = partial(lease_request, pod="")
GATE = "res|global|*"


@pytest.fixture(autouse=True)
def handler():
    registered = handlers.register_handler(RecordingHandler("test"))
    yield registered
    handlers.unregister_handler("test")


def tokens(key=GATE):
    return [entries.token_of(e) for e in (store.counters().find_one({"_id": key}) or {}).get("holders") or ()]


def passes_check(lease) -> bool:
    try:
        lease.check()
    except LeaseLost:
        return False
    return True


# --- item 1: a release that fails half-way -------------------------------------------------


def test_given_a_swap_applied_whose_answer_was_lost_then_the_released_lease_never_passes_check_again(
        monkeypatch, settings):
    # Given: the one slot is held and a ticket waits; the release's hand-off (the swap on the
    # gate) is applied by the server, and its answer is lost.
    define("res", "levels: {global: 1}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    waiter = quiet_waiter(settings, req(user="w"), GATE)
    waiting.note_queue(store.counters().find_one({"_id": GATE}))  # the releaser saw the queue a moment ago
    lost = answer_lost(monkeypatch, "update_one", store.COUNTERS)
    # When: the holder releases: the store failed, as far as it can tell.
    with pytest.raises(LeaseUnavailable):
        held.release()
    assert lost, "the fault was not hit"
    monkeypatch.undo()
    # Then: the slot went on to the waiter (nobody told it: it finds its grant on the gate
    # when it looks, here at once rather than at its far-out poll) ...
    wakeups._deliver([waiter.ticket])
    waiter.join(10)
    assert waiter.lease is not None and tokens() == [waiter.ticket]
    # ... and the released lease is over: neither its check() nor a renewal of its token
    # (any path) keeps it alive beside the new holder.
    assert not passes_check(held)
    with pytest.raises(LeaseLost):
        holders.renew(held.token)
    assert passes_check(waiter.lease)
    # A retry of the release finishes it: holder gone, tombstoned as released, the new
    # holder's slot untouched.
    assert held.release() is True
    assert held.release() is False
    assert store.holders().find_one({"_id": held.token}) is None
    assert store.tombstones().find_one({"_id": held.token})["reason"] == "release"
    assert tokens() == [waiter.ticket]
    waiter.lease.release()
    assert tokens() == []


@pytest.mark.parametrize("applied", [False, True], ids=["delete-not-applied", "delete-applied-answer-lost"])
def test_given_a_release_whose_holder_delete_failed_then_at_most_cap_leases_pass_check(monkeypatch, applied):
    # Given: the one slot is held; the release's delete of the holder fails (sent and
    # applied with its answer lost, or not applied at all).
    define("res", "levels: {global: 1}\nwaitMs: 0")
    held = leases.acquire(req(user="h"))
    lost = answer_lost(monkeypatch, "delete_one", store.HOLDERS, applied=applied)
    with pytest.raises(LeaseUnavailable):
        held.release()
    assert lost, "the fault was not hit"
    monkeypatch.undo()
    # When: another request asks for the slot.
    try:
        other = leases.acquire(req(user="o"))
    except LeaseBusy:
        other = None
    # Then: the release that failed has ended the lease all the same (its check refuses),
    # so at most one lease passes check() on the cap of 1.
    assert not passes_check(held)
    if other is not None:
        assert passes_check(other)
    # A retry of the release finishes it; the slot is free for the next one (or kept by
    # the one that took it).
    assert held.release() is True
    assert store.holders().find_one({"_id": held.token}) is None
    assert store.tombstones().find_one({"_id": held.token})["reason"] == "release"
    if other is None:
        other = leases.acquire(req(user="o"))
    assert tokens() == [other.token]
    other.release()


def test_given_a_release_in_its_first_try_then_its_check_refuses_even_before_the_store_answers(monkeypatch):
    # A release that never reached the store at all still ends the lease for its owner:
    # check() never renews a lease its owner began to release (the retry returns the slot).
    define("res", "levels: {global: 1}\nwaitMs: 0")
    held = leases.acquire(req(user="h"))
    answer_lost(monkeypatch, "delete_one", store.HOLDERS, applied=False)
    answer_lost(monkeypatch, "find_one_and_update", store.COUNTERS, applied=False)
    with pytest.raises(LeaseUnavailable):
        held.release()
    monkeypatch.undo()
    with pytest.raises(LeaseLost):
        held.check()
    with pytest.raises(LeaseLost):
        held.update_payload({"k": 1})
    assert held.release() is True
    assert tokens() == []


@pytest.mark.parametrize("applied", [False, True], ids=["delete-not-applied", "delete-applied-answer-lost"])
def test_given_an_async_release_whose_delete_failed_then_acheck_refuses_and_a_retry_finishes_it(monkeypatch, applied):
    # The same on the async client: a failed arelease() ends the lease for its owner, and a
    # retry finishes the release (True once, tombstoned, the slot back).
    import asyncio

    import pymongo.errors
    from pymongo.asynchronous.collection import AsyncCollection

    from leases import aio

    define("res", "levels: {global: 1}\nwaitMs: 0")
    # The release deletes its holder with a plain delete (what it holds is known).
    real, lost = AsyncCollection.delete_one, []

    async def lossy(self, *args, **kwargs):
        if self.name == store.HOLDERS and not lost:
            lost.append(args)
            if applied:
                await real(self, *args, **kwargs)
            raise pymongo.errors.NetworkTimeout("delete_one on holders: the answer was lost (test fault)")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(AsyncCollection, "delete_one", lossy)

    async def scenario():
        try:
            lease = await leases.aacquire(req(user="h"))
            with pytest.raises(LeaseUnavailable):
                await lease.arelease()
            with pytest.raises(LeaseLost):
                await lease.acheck()
            released = await lease.arelease()
            return lease, released, await lease.arelease()
        finally:
            await aio.aclose()

    lease, released, again = asyncio.run(scenario())
    assert lost and (released, again) == (True, False)
    assert store.holders().find_one({"_id": lease.token}) is None
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "release"
    assert tokens() == []


# --- item 8: a reap is never read as its owner's release -----------------------------------


def _expire(token):
    store.holders().update_one({"_id": token}, {"$set": {"expiresAt": store.server_now() - timedelta(seconds=1)}})


def _repair_between_delete_and_give_back(monkeypatch):
    """A repairer that finds the gate full between the reap's delete and its give-back: the
    real repair, which pulls the entry whose holder is gone."""
    real = waiting.give_back
    repaired = []

    def raced(keys, booking, **kwargs):
        gate = waiting.read_gate(keys[-1])
        repaired.append(waiting.repair(gate, gate["clock"]))
        return real(keys, booking, **kwargs)

    monkeypatch.setattr(waiting, "give_back", raced)
    return repaired


def test_given_a_repair_between_an_idle_reaps_delete_and_its_give_back_then_it_is_a_reap_with_its_handler(
        monkeypatch):
    # Given: a held lease past its deadline, and a repair that pulls its entry right after
    # the reap deleted its holder (the holder is gone: the entry books for nobody).
    define("res", "levels: {global: 1}")
    lease = leases.acquire(req(user="h"))
    _expire(lease.token)
    repaired = _repair_between_delete_and_give_back(monkeypatch)
    # When: the idle reap ends it.
    revoked = reaper.reap_holder({"_id": lease.token}, "idle")
    # Then: it is a reap — returned for the handler's dispatch, tombstoned "idle" — not an
    # owner's release (its owner never released it); the slot came back once.
    assert repaired == [True]
    assert revoked is not None and revoked.reason == "idle"
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "idle"
    assert tokens() == [] and store.counters().find_one({"_id": GATE})["count"] == 0


def test_given_a_repair_between_a_revokes_delete_and_its_give_back_then_the_revoke_answers_the_holder(
        monkeypatch, handler):
    # Given: a held lease, and a repair that pulls its entry right after the operator's
    # revoke deleted its holder.
    define("res", "levels: {global: 1}")
    lease = leases.acquire(req(user="h"))
    _repair_between_delete_and_give_back(monkeypatch)
    # When: an operator revokes it.
    revoked = actions.revoke_holder(lease.token, tenant_id="acme", acting_user="ops", dispatch=False)
    # Then: the revoke answers the holder it deleted (not HolderNotFound), tombstoned
    # "revoke"; the owner's next check says so.
    assert revoked.token == lease.token and revoked.reason == "revoke"
    assert store.holders().find_one({"_id": lease.token}) is None
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "revoke"
    with pytest.raises(LeaseLost) as lost:
        lease.check()
    assert getattr(lost.value, "reason", None) == "revoke"
