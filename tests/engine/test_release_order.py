"""The owner's release deletes its holder first, then returns its slots (by value) and
tombstones it: a holder whose slot has gone on never lives on (issue 34), and a release that
dies in between leaves entries without a holder, which repair returns."""

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
    # Then: the holder was deleted with a plain delete (the owner knows what the release
    # needs of it), then the gate returned, then it was tombstoned in the owner's scope.
    assert counter.commands == ["delete", "findAndModify", "update"]
    tombstone = store.tombstones().find_one({"_id": lease.token})
    assert (tombstone["reason"], tombstone["tenantId"], tombstone["projectId"], tombstone["resource"]) == (
        "release", "acme", "p1", "res")
    assert store.holders().find_one({"_id": lease.token}) is None


def test_given_an_owner_that_deleted_its_holder_and_died_then_repair_returns_its_slot():
    # Given: a release that deleted its holder (its first step) and died before returning
    # its slot: the gate books an entry for a holder that is gone.
    define("res", "levels: {global: 1}")
    lease = leases.acquire(lease_request(pod=""))
    store.holders().delete_one({"_id": lease.token})
    gate = waiting.read_gate("res|global|*")
    # When: the next process that finds the counter full repairs it.
    assert waiting.repair(gate, gate["clock"]) is True
    # Then: the slot is back, once.
    assert store.counters().find_one({"_id": "res|global|*"})["holders"] == []
    assert store.counters().find_one({"_id": "res|global|*"})["count"] == 0


def test_given_a_held_holder_whose_gate_entry_is_gone_when_it_is_reaped_then_its_handler_is_dispatched():
    # A HELD holder is never left by a release (the delete comes first), so a reap that finds
    # its entry gone — pulled by a repair that saw the holder deleted — is still a reap.
    define("res", "levels: {global: 1}")
    lease = leases.acquire(lease_request(pod=""))
    waiting.give_back(list(lease.levels), lease._booking())
    past = store.server_now() - timedelta(seconds=1)
    store.holders().update_one({"_id": lease.token}, {"$set": {"expiresAt": past}})
    revoked = reaper.reap_holder({"_id": lease.token}, "idle")
    assert revoked is not None and revoked.reason == "idle"
    assert store.holders().find_one({"_id": lease.token}) is None
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "idle"


def test_given_a_live_holder_reaped_idle_then_its_handler_is_dispatched_as_before():
    define("res", "levels: {global: 1}")
    lease = leases.acquire(lease_request(pod=""))
    past = store.server_now() - timedelta(seconds=1)
    store.holders().update_one({"_id": lease.token}, {"$set": {"expiresAt": past}})
    revoked = reaper.reap_holder({"_id": lease.token}, "idle")
    assert revoked is not None
    assert store.counters().find_one({"_id": "res|global|*"})["holders"] == []
