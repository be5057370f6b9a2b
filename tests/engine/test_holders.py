"""leases.engine.holders: one renewal rule, one way to end a holder, the tenant-bound filter."""

from __future__ import annotations

from datetime import datetime, timedelta

import pymongo.errors
import pytest

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.engine import holders
from leases.errors import InvalidLeaseRequest, LeaseExpired, StaleLease
from leases.queue import waiting
from leases.store import client as store, tombstones
from leases.upkeep import reaper
from tests.helpers import counted_commands, define, lease_request, quiet_handler_fixture

handler = quiet_handler_fixture("test")


def held(user="u1", levels="levels: {project: 2}"):
    define("res", levels)
    return leases.acquire(lease_request(user=user))


def doc(token):
    return store.holders().find_one({"_id": token})


@pytest.mark.parametrize("bound", [
    {"tenantId": {"$ne": None}},   # an operator where an id belongs
    {"tenantId": ""},
    {"userId": "u1"},              # a scope binds tenant and project only
])
def test_given_a_bad_scope_when_building_the_filter_then_it_is_refused_before_any_query(bound):
    with pytest.raises(InvalidLeaseRequest):
        holders.scoped("A" * 32, bound)


def test_given_a_scope_then_the_filter_carries_tenant_and_project():
    assert holders.scoped("t", holders.scope("acme", "p1")) == {"_id": "t", "tenantId": "acme", "projectId": "p1"}
    assert holders.scoped("t", holders.scope("acme")) == {"_id": "t", "tenantId": "acme"}
    assert holders.scoped("t", None) == {"_id": "t"}


def test_given_another_tenants_scope_when_renewing_or_releasing_then_stale_and_nothing_changes():
    lease = held()
    before = doc(lease.token)
    with pytest.raises(StaleLease):
        holders.renew(lease.token, bound=holders.scope("globex"))
    assert holders.release(lease.token, bound=holders.scope("globex")) is None
    assert doc(lease.token) == before
    lease.release()


def test_given_a_held_lease_when_renewed_then_one_command_sets_now_plus_ttl_on_server_time():
    lease = held()
    with counted_commands() as counted:
        after = holders.renew(lease.token, bound=holders.scope("acme", "p1"))
    assert counted.commands == ["findAndModify"]
    assert after["expiresAt"] - after["lastSeenAt"] == pytest.approx(timedelta(seconds=after["ttlSeconds"]),
                                                                    abs=timedelta(milliseconds=20))
    assert doc(lease.token)["expiresAt"] == after["expiresAt"]
    lease.release()


def test_given_a_later_deadline_when_renewed_then_it_is_kept_with_one_more_command():
    lease = held()
    later = doc(lease.token)["expiresAt"] + timedelta(hours=1)
    store.holders().update_one({"_id": lease.token}, {"$set": {"expiresAt": later}})
    with counted_commands() as counted:
        after = holders.renew(lease.token)
    assert counted.commands == ["findAndModify", "update"]
    assert after["expiresAt"] == later == doc(lease.token)["expiresAt"]
    lease.release()


def test_given_a_holder_past_its_deadline_when_renewed_then_expired_and_it_ends_with_a_tombstone():
    lease = held()
    store.holders().update_one({"_id": lease.token}, [{"$set": {"expiresAt": {"$subtract": ["$$NOW", 1000]}}}])
    with pytest.raises(LeaseExpired) as expired:
        holders.renew(lease.token, payload={"late": True})
    assert expired.value.reason == "idle"
    assert doc(lease.token) is None
    assert store.counters().find_one({"_id": "res|project|acme/p1"})["count"] == 0
    # Terminal from now on, with the reason, whichever path asks.
    with pytest.raises(LeaseExpired) as again:
        holders.renew(lease.token, bound=holders.scope("acme"))
    assert again.value.reason == "idle"


def test_given_an_idle_expiry_whose_delete_failed_when_renewed_again_then_still_expired_and_never_revived(
        monkeypatch):
    # Given: a lease past its deadline, and a store hiccup that fails the delete of the
    # idle expiry its renewal starts.
    lease = held()
    store.holders().update_one({"_id": lease.token}, [{"$set": {"expiresAt": {"$subtract": ["$$NOW", 1000]}}}])
    deadline = doc(lease.token)["expiresAt"]
    real_end, failed = holders.end, []

    def end_failing_once(query, reason, **kw):
        if not failed:
            failed.append(reason)
            raise pymongo.errors.AutoReconnect("injected: the idle expiry's delete failed")
        return real_end(query, reason, **kw)

    monkeypatch.setattr(holders, "end", end_failing_once)
    with pytest.raises(LeaseExpired):
        holders.renew(lease.token, payload={"late": True})
    assert failed == ["idle"]
    # Then: the renewal that answered EXPIRED gave the holder no new deadline (nor payload)...
    after = doc(lease.token)
    assert after["expiresAt"] == deadline
    assert after["payload"] == {}
    # ... so the next renewal answers EXPIRED again (and reaps it now), never RENEWED.
    with pytest.raises(LeaseExpired) as again:
        holders.renew(lease.token)
    assert again.value.reason == "idle"
    assert doc(lease.token) is None
    assert store.counters().find_one({"_id": "res|project|acme/p1"})["count"] == 0


@pytest.mark.parametrize("prior,now,expires,verdict", [
    (None, 10, 40, holders.RENEWED),            # a holder renewed for the first time since
    (20, 10, 40, holders.RENEWED),
    (10, 10, 40, holders.RENEWED),              # exactly at the deadline: still alive (as the reaper sees it)
    (9, 10, 40, holders.EXPIRED),
    (50, 10, 40, holders.KEEP_LATER),
])
def test_given_the_two_server_times_of_a_renewal_then_the_verdict_follows_the_rule(prior, now, expires, verdict):
    at = lambda s: None if s is None else datetime(2026, 1, 1) + timedelta(seconds=s)  # noqa: E731
    assert holders.verdict({"priorExpiresAt": at(prior), "lastSeenAt": at(now), "expiresAt": at(expires)}) == verdict


def test_given_a_pending_holder_when_reaped_then_no_tombstone_but_when_released_then_one():
    store.holders().insert_one({"_id": "P" * 32, "state": "PENDING", "tenantId": "acme", "projectId": "p1",
                                "userId": "u1", "keys": [], "resource": "res"})
    store.holders().insert_one({"_id": "Q" * 32, "state": "PENDING", "tenantId": "acme", "projectId": "p1",
                                "userId": "u1", "keys": [], "resource": "res"})
    deleted, revoked = reaper.reap({"_id": "P" * 32}, "idle")
    assert deleted["_id"] == "P" * 32 and revoked is None  # never handed out: nothing to dispatch
    assert store.tombstones().find_one({"_id": "P" * 32}) is None
    assert holders.release("Q" * 32, bound=holders.scope("acme")) is not None
    assert store.tombstones().find_one({"_id": "Q" * 32})["reason"] == "release"


def test_given_a_release_then_the_tombstone_is_bound_to_the_holders_tenant_and_project():
    lease = held()
    assert lease.release() is True
    tombstone = store.tombstones().find_one({"_id": lease.token})
    assert (tombstone["tenantId"], tombstone["projectId"], tombstone["reason"]) == ("acme", "p1", "release")
    with pytest.raises(StaleLease):  # another tenant learns nothing, not even that it ended
        holders.renew(lease.token, bound=holders.scope("globex"))
    with pytest.raises(LeaseExpired):
        holders.renew(lease.token, bound=holders.scope("acme", "p1"))


def tombstone_fields(token):
    return store.tombstones().find_one({"_id": token}, {"_id": 0, "at": 0, "handledBy": 0, "handledAt": 0})


RES_TOMBSTONE = {"tenantId": "acme", "projectId": "p1", "resource": "res"}


def test_given_a_dropped_ticket_then_its_tombstone_has_the_shape_of_a_released_holders():
    released = held()
    released.release()
    for token in ("P" * 32, "Q" * 32):
        store.holders().insert_one({"_id": token, "state": "PENDING", "tenantId": "acme", "projectId": "p1",
                                    "userId": "u1", "keys": ["res|project|acme/p1"], "resource": "res"})
    with counted_commands() as counted:
        dropped = holders.drop_ticket({"_id": "P" * 32}, "abandoned")
    assert dropped["_id"] == "P" * 32 and doc("P" * 32) is None
    assert counted.commands == ["findAndModify", "update"]  # the delete, the tombstone: no read between
    assert tombstone_fields("P" * 32) == {**RES_TOMBSTONE, "reason": "abandoned"}
    assert set(tombstone_fields("P" * 32)) == set(tombstone_fields(released.token))
    # Another tenant's filter matches nothing and writes nothing.
    assert holders.drop_ticket(holders.scoped("Q" * 32, holders.scope("globex")), "abandoned") is None
    assert doc("Q" * 32) is not None and store.tombstones().find_one({"_id": "Q" * 32}) is None
    answer = holders.ended("P" * 32, holders.scope("acme", "p1"), noun="ticket")
    assert isinstance(answer, LeaseExpired) and answer.reason == "abandoned" and "ticket" in str(answer)


def test_given_a_ticket_someone_else_deleted_when_dropped_as_known_then_it_is_tombstoned_all_the_same():
    ticket = {"_id": "K" * 32, "state": "PENDING", "tenantId": "acme", "projectId": "p1", "resource": "res"}
    assert holders.drop_ticket({"_id": "K" * 32}, "ticket-expired") is None
    assert store.tombstones().find_one({"_id": "K" * 32}) is None  # unknown and not known: nothing to say
    assert holders.drop_ticket({"_id": "K" * 32}, "ticket-expired", known=ticket) is None
    assert tombstone_fields("K" * 32) == {**RES_TOMBSTONE, "reason": "ticket-expired"}


def test_given_an_abandoned_ticket_then_it_leaves_the_queue_before_it_is_tombstoned():
    config.put_document("_vance", "_tenant", document_path("res"), "levels: {global: 1}\nwaitMs: 0")
    gate_key = "res|global|*"
    holding = leases.acquire(leases.LeaseRequest(type="test", lease="res", tenant_id="acme", project_id="p1",
                                                 user_id="h"))
    token = "W" * 32
    store.holders().insert_one({"_id": token, "state": "PENDING", "tenantId": "acme", "projectId": "p1",
                                "userId": "w", "keys": [gate_key], "resource": "res"})
    now = store.server_now()
    waiting.enqueue(gate_key, {"id": token, "t": "acme", "p": "p1", "u": "w", "at": now, "seen": now, "ttl": 60000})
    with counted_commands() as counted:
        assert holders.drop_ticket({"_id": token}, "abandoned", dequeue=True) is not None
    assert counted.commands == ["findAndModify", "update", "update"]
    assert [t["id"] for t in store.counters().find_one({"_id": gate_key}).get("queue") or ()] == []
    assert tombstone_fields(token) == {**RES_TOMBSTONE, "reason": "abandoned"}
    holding.release()


def test_given_tickets_the_queue_drops_then_their_tombstones_have_the_one_shape_with_the_gates_resource():
    config.put_document("_vance", "_tenant", document_path("res"), "levels: {global: 1}\nwaitMs: 0")
    gate_key = "res|global|*"
    holding = leases.acquire(leases.LeaseRequest(type="test", lease="res", tenant_id="acme", project_id="p1",
                                                 user_id="h"))
    token = "G" * 32
    now = store.server_now()
    waiting.enqueue(gate_key, {"id": token, "t": "acme", "p": "p1", "u": "w", "at": now, "seen": now, "ttl": 60000})
    waiting.prune(store.counters().find_one({"_id": gate_key}), [token], reason="waiter-gone")
    assert tombstone_fields(token) == {**RES_TOMBSTONE, "reason": "waiter-gone"}
    answer = holders.ended(token, holders.scope("acme", "p1"))
    assert isinstance(answer, LeaseExpired) and answer.reason == "waiter-gone"
    holding.release()


def test_given_a_claim_on_an_existing_tombstone_then_its_fields_and_time_stay():
    fields = tombstones.tombstone_fields({"_id": "t", "tenantId": "acme", "projectId": "p1", "resource": "res"},
                                      "revoke", keep=True)
    assert fields["at"] == {"$ifNull": ["$at", "$$NOW"]}
    assert fields["reason"] == {"$ifNull": ["$reason", {"$literal": "revoke"}]}
    assert set(fields) == {"tenantId", "projectId", "resource", "reason", "at"}
