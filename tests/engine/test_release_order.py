"""The owner's release returns its slots first (the hand-off does not wait for the delete),
then deletes the holder: a release that dies in between is reaped later as released."""

from __future__ import annotations

from datetime import timedelta

import leases
from leases.queue import waiting
from leases.store import client as store
from leases.upkeep import reaper
from tests import helpers
from tests.helpers import define, lease_request, quiet_handler_fixture

handler = quiet_handler_fixture("test")


def test_given_a_release_then_the_holder_is_gone_its_slot_is_free_and_it_is_tombstoned_as_released():
    define("res", "levels: {global: 1}")
    lease = leases.acquire(lease_request(pod=""))
    assert lease.release() is True
    assert store.holders().find_one({"_id": lease.token}) is None
    assert store.counters().find_one({"_id": "res|global|*"})["holders"] == []
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "release"
    assert lease.release() is False  # idempotent


def test_given_an_owners_release_then_its_holder_is_deleted_without_being_read_back():
    # Given: a held lease of tenant acme, project p1.
    define("res", "levels: {global: 1}")
    lease = leases.acquire(lease_request(pod=""))
    # When: its owner releases it, the commands counted.
    with helpers.counted_commands() as counter:
        assert lease.release() is True
    # Then: the gate was returned, the holder deleted with a plain delete (the owner knows
    # what the release needs of it) and tombstoned in the owner's scope.
    assert counter.commands == ["findAndModify", "delete", "update"]
    tombstone = store.tombstones().find_one({"_id": lease.token})
    assert (tombstone["reason"], tombstone["tenantId"], tombstone["projectId"], tombstone["resource"]) == (
        "release", "acme", "p1", "res")
    assert store.holders().find_one({"_id": lease.token}) is None


def test_given_an_owner_that_returned_its_slots_and_died_when_its_holder_is_reaped_then_no_handler_runs():
    # Given: a release that returned the slots (its first step) and died before its delete.
    define("res", "levels: {global: 1}")
    lease = leases.acquire(lease_request(pod=""))
    waiting.give_back(list(lease.levels), lease._booking())
    # When: its holder passes its deadline and the idle reap ends it.
    past = store.server_now() - timedelta(seconds=1)
    store.holders().update_one({"_id": lease.token}, {"$set": {"expiresAt": past}})
    revoked = reaper.reap_holder({"_id": lease.token}, "idle")
    # Then: it ends as released — no handler to dispatch, the tombstone says so.
    assert revoked is None
    assert store.holders().find_one({"_id": lease.token}) is None
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "release"


def test_given_a_live_holder_reaped_idle_then_its_handler_is_dispatched_as_before():
    define("res", "levels: {global: 1}")
    lease = leases.acquire(lease_request(pod=""))
    past = store.server_now() - timedelta(seconds=1)
    store.holders().update_one({"_id": lease.token}, {"$set": {"expiresAt": past}})
    revoked = reaper.reap_holder({"_id": lease.token}, "idle")
    assert revoked is not None
    assert store.counters().find_one({"_id": "res|global|*"})["holders"] == []
