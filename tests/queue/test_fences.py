"""Fences issued by the engine (leases.queue.fences): one per grant, in the booking update, per
(counter, slot) strictly increasing across every way a booking ends."""

from __future__ import annotations

import asyncio
import json

import pytest

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path, load
from leases.engine import holders
from leases.errors import InvalidDefinition, LeaseUnavailable
from leases.queue import fences, waiting
from leases.store import client as store, fence_codec
from leases.upkeep import reaper, sweeps
from tests.helpers import counted_commands, queue_up, quiet_handler_fixture

handler = quiet_handler_fixture()


@pytest.fixture(autouse=True)
def blind_process():
    # Each test starts without this process's views of counters an earlier test left (the
    # store is emptied between tests; a view of a counter that is gone is a process's past).
    fences.forget()
    yield
    fences.forget()


def put(name, text, tenant="_vance", project="_tenant"):
    config.put_document(tenant, project, document_path(name), text)


def req(lease="res", tenant="acme", project="p1", user="u1", **kw):
    return leases.LeaseRequest(type="test", lease=lease, tenant_id=tenant, project_id=project, user_id=user, **kw)


def slot_of(lease):
    return fence_codec.decode(lease.fence)


def gate(key="res|global|*"):
    return store.counters().find_one({"_id": key})


def test_given_a_capped_lease_when_acquired_then_its_fence_names_the_gate_a_slot_and_a_generation():
    # Given: a lease capped at two levels.
    put("res", "levels: {global: 3, user: 2}")
    # When: it is acquired.
    lease = leases.acquire(req())
    # Then: the fence is on the gate (the widest capped level), a slot below the cap, a generation
    # at least the server clock's millisecond x 1000; the holder and the gate record it.
    fence = slot_of(lease)
    assert fence.counter == "res|global|*" and 0 <= fence.slot < 3
    holder = store.holders().find_one({"_id": lease.token})
    assert holder["fence"] == lease.fence
    assert fence.generation >= fences.floor_of(holder["acquiredAt"])
    recorded = gate()["fence"][f"s{fence.slot}"]
    assert recorded == {"e": lease._booking(), "g": fence.generation}
    # And: a renewal answers the same fence.
    assert holders.renew(lease.token)["fence"] == lease.fence
    lease.release()


def test_given_cap_two_then_live_holders_have_distinct_slots_and_a_freed_slot_comes_back_newer():
    put("res", "levels: {global: 2}")
    a, b = leases.acquire(req(user="a")), leases.acquire(req(user="b"))
    assert {slot_of(a).slot, slot_of(b).slot} == {0, 1}
    # When: a releases and c takes the only free slot.
    a.release()
    c = leases.acquire(req(user="c"))
    # Then: c has a's slot with a strictly newer generation; b keeps its own.
    assert slot_of(c).slot == slot_of(a).slot and slot_of(c).generation > slot_of(a).generation
    assert slot_of(b).slot != slot_of(c).slot
    b.release()
    c.release()


def test_given_a_stale_view_proposing_an_occupied_slot_then_the_booking_refuses_it_and_proposes_again():
    # Given: a holder on slot 0 of a cap-2 gate, and a process view that wrongly says slot 0
    # is free with generation 0 (another process booked it since this one looked).
    put("res", "levels: {global: 2}")
    fences.note({"_id": "res|global|*", "holders": [], "fence": {}})
    first = leases.acquire(req(user="a"))
    taken = slot_of(first).slot
    assert taken == 0  # the only slot a view of an empty counter proposes
    fences.note({"_id": "res|global|*", "holders": [], "fence": {}})
    for _ in range(8):  # whichever slot the view's random pick proposes, the booking tells
        # When: another holder books, then gives the slot back.
        other = leases.acquire(req(user="b"))
        # Then: never the occupied slot: the filter refused the proposal and the retry read the gate.
        assert slot_of(other).slot != taken
        other.release()
        fences.note({"_id": "res|global|*", "holders": [], "fence": {}})
    first.release()


def test_given_a_view_with_a_newer_generation_than_proposed_then_the_recorded_generation_still_only_grows():
    # Given: slot 0 recorded far in the future (a counter written by a server with a clock ahead).
    put("res", "levels: {global: 1}")
    leases.acquire(req()).release()
    ahead = fences.floor_of(store.server_now()) * 10
    store.counters().update_one({"_id": "res|global|*"}, {"$set": {"fence.s0.g": ahead}})
    fences.forget()
    # When: the slot is granted again.
    lease = leases.acquire(req())
    # Then: above the recorded generation, though the floor (the clock) is below it.
    assert slot_of(lease).generation == ahead + 1
    lease.release()


@pytest.mark.parametrize("ending", ["release", "reap", "revoke", "repair", "reconcile"])
def test_given_each_way_a_booking_ends_then_the_next_grant_of_the_slot_has_a_newer_generation(ending):
    put("res", "levels: {global: 1}")
    lease = leases.acquire(req())
    before = slot_of(lease)
    if ending == "release":
        lease.release()
    elif ending == "reap":
        store.holders().update_one({"_id": lease.token}, [{"$set": {"expiresAt": {"$subtract": ["$$NOW", 1000]}}}])
        assert reaper.reap_idle()[0] == 1
    elif ending == "revoke":
        reaper.reap({"_id": lease.token}, "revoke")
    else:
        # The holder document vanished without its pull (a crash mid-release): repair or
        # reconcile returns the slot.
        store.holders().delete_one({"_id": lease.token})
        if ending == "repair":
            doc = waiting.read_gate("res|global|*")
            assert waiting.repair(doc, doc["clock"])
        else:
            assert sweeps.reconcile(safety_ms=0)[0] == 1
    after = leases.acquire(req(user="next"))
    assert slot_of(after).slot == before.slot and slot_of(after).generation > before.generation
    after.release()


def test_given_an_idle_counter_that_issued_fences_then_reconcile_keeps_it_with_its_generations():
    put("res", "levels: {global: 1, user: 1}")
    leases.acquire(req()).release()
    # When: reconcile runs with no safety margin (idle counters are deleted).
    sweeps.reconcile(safety_ms=0)
    # Then: the user counter (no fences) is gone, the gate with its slots stays.
    assert store.counters().find_one({"_id": "res|user|acme/u1"}) is None
    assert gate()["fence"]["s0"]["g"] > 0


def test_given_a_counter_deleted_by_hand_then_the_clock_floor_keeps_generations_above_the_old_ones():
    put("res", "levels: {global: 1}")
    lease = leases.acquire(req())
    old = slot_of(lease).generation
    lease.release()
    store.counters().delete_many({})
    fences.forget()
    again = leases.acquire(req())
    assert slot_of(again).generation > old
    again.release()


def test_given_a_fence_level_then_grants_are_fenced_on_that_counter():
    # Given: one browser session per user, under a global ceiling.
    put("res", "levels: {global: 5, user: 1}\nfence: user")
    lease = leases.acquire(req(user="carol"))
    # Then: the fence names carol's user counter, which records the slot.
    assert slot_of(lease).counter == "res|user|acme/carol" and slot_of(lease).slot == 0
    assert store.counters().find_one({"_id": "res|user|acme/carol"})["fence"]["s0"]["e"] == lease._booking()
    assert "fence" not in gate()
    assert load("res", "acme", "p1").to_dict()["fence"] == "user"
    lease.release()


def test_given_a_fence_level_the_lease_does_not_cap_then_acquiring_fails_closed():
    put("res", "levels: {global: 5}\nfence: user")
    with pytest.raises(LeaseUnavailable, match="fence names level 'user'"):
        leases.acquire(req())
    assert store.holders().count_documents({}) == 0


def test_given_a_fence_that_names_no_level_then_the_document_is_refused():
    with pytest.raises(InvalidDefinition, match="fence must name a level"):
        put("res", "levels: {global: 5}\nfence: galaxy")


def test_given_a_fence_level_in_a_tenant_layer_then_it_is_ignored():
    # The guard's counter is the operator's choice: a tenant cannot move its holders off it.
    put("res", "levels: {global: 5, user: 1}")
    put("res", "fence: user", tenant="acme")
    assert load("res", "acme", "p1").fence_level is None


def test_given_a_waiting_ticket_when_the_slot_frees_then_its_grant_carries_a_newer_fence_of_that_slot():
    put("res", "levels: {global: 1}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    waiter = queue_up(req(user="w"), "res|global|*")
    held.release()
    waiter.join(10)
    assert waiter.lease is not None
    assert slot_of(waiter.lease).slot == slot_of(held).slot
    assert slot_of(waiter.lease).generation > slot_of(held).generation
    waiter.lease.release()


def test_given_an_async_acquire_then_its_lease_has_the_fence_its_booking_recorded():
    put("res", "levels: {global: 2}")

    async def scenario():
        try:
            lease = await leases.aacquire(req())
            fence = lease.fence
            await lease.arelease()
            return fence
        finally:
            await leases.aio.aclose()

    fence = asyncio.run(scenario())
    decoded = fence_codec.decode(fence)
    assert gate()["fence"][f"s{decoded.slot}"]["g"] == decoded.generation


def test_given_a_warm_process_then_the_fence_costs_no_command():
    put("res", "levels: {global: 9, tenant: 9, project: 9, user: 9}\nfence: project")
    from leases.definitions import invalidation

    assert invalidation.wait_listening()
    leases.acquire(req()).release()
    with counted_commands() as counted:
        lease = leases.acquire(req())
        lease.release()
    assert lease.fence is not None
    # acquire: holder, the ordered bulk, HELD; release: delete, the narrower levels, the gate, tombstone
    assert counted.commands == ["findAndModify", "update", "findAndModify", "delete", "update", "findAndModify",
                                "update"]


def test_given_racing_bookings_taking_the_proposed_slots_then_a_level_with_room_still_grants(monkeypatch):
    # Given: a cap-3 gate with a holder on slot 0, and two proposals in a row that name it
    # (as when other processes' bookings take the slots this one proposes, twice).
    put("res", "levels: {global: 3}")
    fences.note({"_id": "res|global|*", "holders": [], "fence": {}})
    first = leases.acquire(req(user="a"))
    assert slot_of(first).slot == 0
    real_plan, raced = fences.plan, []

    def racing_plan(spec, entry, **kw):
        proposal = real_plan(spec, entry, **kw)
        if len(raced) < 2:
            raced.append(proposal)
            return fences.Plan(proposal.key, 0, proposal.generation, entry)
        return proposal

    monkeypatch.setattr(fences, "plan", racing_plan)
    # When: a request that does not wait books.
    second = leases.acquire(req(user="b", wait_ms=0))
    # Then: granted on a free slot (not Busy: the counter had room all along).
    assert len(raced) == 2 and slot_of(second).slot != 0
    first.release()
    second.release()


def test_given_a_counter_written_before_entries_then_the_fence_is_proposed_from_it_as_converted():
    # Given: a holder on slot 0, a process view that says slot 0 is free, and the gate as a
    # version before entries left it (no holders list).
    put("res", "levels: {global: 20}")
    fences.note({"_id": "res|global|*", "holders": [], "fence": {}})
    first = leases.acquire(req(user="a"))
    store.counters().update_one({"_id": "res|global|*"}, {"$unset": {"holders": ""}})
    fences.note({"_id": "res|global|*", "holders": [], "fence": {}})
    # When: the next acquire converts the counter on its way.
    second = leases.acquire(req(user="b", wait_ms=0))
    # Then: it books a slot the conversion shows free, not the converted holder's.
    assert slot_of(second).slot != slot_of(first).slot
    assert sorted(gate()["holders"]) == sorted([first._booking(), second._booking()])


def test_given_a_full_view_when_a_wake_up_hint_frees_a_slot_then_the_waiter_proposes_that_slot():
    # Given: a process that last saw a cap-2 gate full (its waiter's keep-alive).
    put("res", "levels: {global: 2}")
    spec = load("res", "acme", "p1").level_specs("acme", "p1", "u1")[-1]
    fences.note({"_id": spec.key, "holders": ["a", "b"], "fence": {"s0": {"e": "a", "g": 10}, "s1": {"e": "b", "g": 20}}})
    # When: the releaser's wake-up arrives with the gate its own update returned (b gone).
    released = {"_id": spec.key, "holders": ["a"], "fence": {"s0": {"e": "a", "g": 10}, "s1": {"e": "b", "g": 20}}}
    from leases.queue import wakeups

    wakeups.on_message(json.dumps(["ticket-x", fences.hint_of(released)]))
    # Then: the proposal is the freed slot, above its generation.
    proposal = fences.plan(spec, "me", floor=1)
    assert (proposal.slot, proposal.generation) == (1, 21)


def test_given_a_waiter_in_another_process_then_the_wake_up_carries_the_freed_slots():
    import redis

    from leases.queue import wakeups

    put("res", "levels: {global: 2}")
    a, b = leases.acquire(req(user="a")), leases.acquire(req(user="b"))
    store.counters().update_one({"_id": "res|global|*"}, {"$push": {"queue": {
        "id": "ticket-x", "t": "acme", "p": "p1", "u": "w", "w": "other-process"}}})
    subscriber = redis.Redis.from_url(wakeups._redis_url()).pubsub()
    subscriber.subscribe(wakeups.channel("other-process"))
    assert subscriber.get_message(timeout=5)["type"] == "subscribe"
    b.release()
    doc = gate()
    waiting.wake(doc, ["ticket-x"])
    message = subscriber.get_message(timeout=5)
    subscriber.close()
    ticket, hint = json.loads(message["data"])
    assert ticket == "ticket-x"
    assert hint["fence"]["k"] == "res|global|*"
    assert hint["fence"]["free"] == {f"s{slot_of(b).slot}": slot_of(b).generation}
    a.release()


def test_given_an_uncapped_lease_then_its_noop_lease_has_no_fence():
    put("res", "ttlSeconds: 10")
    assert leases.acquire(req()).fence is None
    assert leases.ANOOP.fence is None


def test_given_waiters_picked_together_then_each_proposes_its_own_free_slot():
    # Given: a cap-3 gate whose slot 1 is booked; the order rule picked tickets a and b.
    put("res", "levels: {global: 3}")
    spec = load("res", "acme", "p1").level_specs("acme", "p1", "u1")[-1]
    doc = {"_id": spec.key, "cap": 3, "holders": ["x"], "fence": {"s1": {"e": "x", "g": 5}, "s0": {"e": "gone", "g": 4}}}
    assigned = fences.turns(doc, ["a", "b"])
    assert assigned == {"a": 0, "b": 2}
    # When: each process remembers the turns (its own _decide, or the waker's hint).
    fences.note(doc)
    fences.expect(spec.key, assigned)
    # Then: their proposals are their own slots, whatever the random pick would have chosen.
    assert fences.plan(spec, "acme/p1/u/att/a", floor=1).slot == 0
    assert fences.plan(spec, "acme/p1/u/att/b", floor=1).slot == 2
