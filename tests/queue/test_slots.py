"""leases.queue.slots against the real store: what take, give_back and the pulls do to the
counter documents (booking entries, caps, the gate's queue), and the orphan split repair uses.

Entries are booked under made-up tokens (no holder needed to take a slot); the holder
documents orphans() reads are written as the engine writes them, before their entries.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from leases.definitions.model import LevelSpec
from leases.queue import estimates, slots
from leases.store import client as store, entries

USER = LevelSpec(level="user", scope="acme/u1", cap=2, key="res|user|acme/u1", tenant_id="acme")
PROJECT = LevelSpec(level="project", scope="acme/p1", cap=1, key="res|project|acme/p1", tenant_id="acme")
GLOBAL = LevelSpec(level="global", scope="*", cap=3, key="res|global|*", tenant_id=None)
SPECS = [USER, PROJECT, GLOBAL]  # narrow → wide; the widest is the gate
GATE = GLOBAL.key


def booking(user: str = "u1", token: str = "tok1", attempt: str = "a1") -> str:
    return entries.entry("acme", "p1", user, token, attempt)


def counter(key: str) -> dict | None:
    return store.counters().find_one({"_id": key})


def counts() -> dict[str, tuple[int, list[str]]]:
    """Every counter as ``key -> (count, holders)``."""
    return {d["_id"]: (d["count"], d.get("holders")) for d in store.counters().find({})}


def test_given_no_counters_when_taking_then_each_level_is_created_with_the_entry_and_its_shape():
    mine = booking()
    assert slots.take(SPECS, mine, "res", gate_key=GATE) == 3
    assert counts() == {USER.key: (1, [mine]), PROJECT.key: (1, [mine]), GLOBAL.key: (1, [mine])}
    doc = counter(PROJECT.key)
    assert (doc["resource"], doc["level"], doc["scope"], doc["tenantId"], doc["cap"]) == (
        "res", "project", "acme/p1", "acme", 1)
    assert doc["updatedAt"] is not None


def test_given_a_full_middle_level_when_taking_then_the_narrower_is_booked_and_nothing_wider_is_touched():
    other = booking(user="u2", token="tok2")
    assert slots.take([PROJECT], other, "res", gate_key=GATE) == 1  # the project's one slot
    mine = booking()
    assert slots.take(SPECS, mine, "res", gate_key=GATE) == 1  # only the user level, the first
    assert counts() == {USER.key: (1, [mine]), PROJECT.key: (1, [other])}  # no global counter at all
    # The caller gives back what it booked; the full level is untouched by that.
    slots.give_back([USER.key], mine)
    assert counts() == {USER.key: (0, []), PROJECT.key: (1, [other])}


def test_given_a_level_at_its_cap_then_the_next_entry_is_refused_and_the_count_never_passes_the_cap():
    taken = [slots.take([GLOBAL], booking(user=f"u{i}", token=f"t{i}"), "res", gate_key="other") for i in range(5)]
    assert taken == [1, 1, 1, 0, 0]
    count, holders = counts()[GLOBAL.key]
    assert count == GLOBAL.cap == len(holders)


def test_given_threads_racing_for_one_counter_then_exactly_the_cap_is_booked_once_each():
    slots.create(GLOBAL, "res")  # a first use would make all but one insert collide: not the race here
    results: dict[int, int] = {}
    start = threading.Barrier(12)

    def take(i: int) -> None:
        start.wait()
        results[i] = slots.take([GLOBAL], booking(user=f"u{i}", token=f"t{i}"), "res", gate_key="other")

    threads = [threading.Thread(target=take, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results.values()) == [0] * 9 + [1] * 3
    count, holders = counts()[GLOBAL.key]
    winners = {i for i, booked in results.items() if booked}
    assert count == 3 and sorted(holders) == sorted(booking(user=f"u{i}", token=f"t{i}") for i in winners)


def test_given_an_entry_already_booked_when_taking_it_again_then_it_is_not_booked_twice():
    mine = booking()
    assert slots.take([USER], mine, "res", gate_key="other") == 1
    assert slots.take([USER], mine, "res", gate_key="other") == 0  # cap 2 has room: the entry itself refuses
    assert counts()[USER.key] == (1, [mine])


def test_given_a_counter_written_before_entries_then_take_refuses_it_until_converted():
    store.counters().insert_one({"_id": USER.key, "count": 1, "resource": "res", "level": "user"})
    store.holders().insert_one({"_id": "old", "levels": [USER.key], "tenantId": "acme", "projectId": "p1",
                                "userId": "u0"})  # booked before entries: no attempt either
    assert slots.take([USER], booking(), "res", gate_key="other") == 0
    assert counts()[USER.key] == (1, None)  # its count would stop matching a list it does not have

    legacy = counter(USER.key)
    assert slots.convert_legacy(legacy, slots.entries_by_key([USER.key]), safety=timedelta(0),
                                now=store.server_now() + timedelta(seconds=1)) is True
    old = entries.entry("acme", "p1", "u0", "old")
    assert counts()[USER.key] == (1, [old])
    assert slots.take([USER], booking(), "res", gate_key="other") == 1
    assert counts()[USER.key] == (2, [old, booking()])


def test_given_a_ticket_queued_on_the_gate_then_a_newcomer_may_not_take_it_but_the_picked_ticket_may():
    store.counters().insert_one({"_id": GATE, "count": 0, "holders": [], "queue": [{"id": "tk1"}, {"id": "tk2"}],
                                 "resource": "res", "level": "global"})
    newcomer = booking(user="u2", token="tok2")
    assert slots.take([GLOBAL], newcomer, "res", gate_key=GATE) == 0  # no barging past the queue
    picked = booking()
    assert slots.take([GLOBAL], picked, "res", gate_key=GATE, privileged=True, ticket="tk1",
                      charge={"$inc": {"served.acme": 1}}) == 1
    doc = counter(GATE)
    assert (doc["count"], doc["holders"], [t["id"] for t in doc["queue"]]) == (1, [picked], ["tk2"])
    assert doc["served"] == {"acme": 1}  # the order rule's charge, in the same update


def test_given_a_ticket_no_longer_queued_then_its_privileged_take_books_nothing():
    store.counters().insert_one({"_id": GATE, "count": 0, "holders": [], "queue": [{"id": "tk2"}],
                                 "resource": "res", "level": "global"})
    assert slots.take([GLOBAL], booking(), "res", gate_key=GATE, privileged=True, ticket="pruned") == 0
    doc = counter(GATE)
    assert (doc["count"], doc["holders"], [t["id"] for t in doc["queue"]]) == (0, [], ["tk2"])


def test_given_a_booking_when_given_back_twice_then_each_slot_returns_once_and_the_gate_comes_back():
    mine, other = booking(), booking(user="u2", token="tok2")
    slots.take(SPECS, mine, "res", gate_key=GATE)
    slots.take([GLOBAL], other, "res", gate_key=GATE)
    after = slots.give_back([USER.key, PROJECT.key, GATE], mine, record=estimates.hold_update(250))
    assert after is not None and (after["_id"], after["count"], after["holders"]) == (GATE, 1, [other])
    assert after["holds"] == [250.0] and after["clock"] is not None  # the hold recorded, the hand-off stamped
    assert counts() == {USER.key: (0, []), PROJECT.key: (0, []), GATE: (1, [other])}
    assert slots.give_back([USER.key, PROJECT.key, GATE], mine) is None  # a racing releaser returns nothing
    assert counts() == {USER.key: (0, []), PROJECT.key: (0, []), GATE: (1, [other])}


def test_given_an_entry_when_pulled_by_value_then_once_only_and_other_entries_stay():
    mine, other = booking(), booking(user="u2", token="tok2")
    slots.take([GLOBAL], mine, "res", gate_key="other")
    slots.take([GLOBAL], other, "res", gate_key="other")
    after = slots.pull_entry(GLOBAL.key, mine)
    assert (after["count"], after["holders"]) == (1, [other])
    assert slots.pull_entry(GLOBAL.key, mine) is None
    assert counts()[GLOBAL.key] == (1, [other])


def test_given_entries_of_missing_superseded_expired_and_live_holders_then_orphans_tells_them_apart():
    now = store.server_now()
    store.holders().insert_many([
        {"_id": "live", "attemptId": "a1", "expiresAt": now + timedelta(minutes=1)},
        {"_id": "expired", "attemptId": "a1", "expiresAt": now - timedelta(seconds=1)},
        {"_id": "rewritten", "attemptId": "a2", "expiresAt": now + timedelta(minutes=1)},
    ])
    live, expired = booking(token="live"), booking(user="u2", token="expired")
    gone, superseded = booking(user="u3", token="gone"), booking(user="u4", token="rewritten", attempt="a1")
    missing, past, late = slots.orphans([live, expired, gone, superseded, gone], now)
    assert sorted(missing) == sorted([gone, superseded])  # each once, however often listed
    assert past == ["expired"]
    assert late == []
    assert slots.orphans([], now) == ([], [], [])


def test_given_grants_past_their_claim_window_then_orphans_names_only_those_still_pending():
    now = store.server_now()
    later = now + timedelta(minutes=1)
    store.holders().insert_many([
        {"_id": "unclaimed", "attemptId": "a1", "state": "PENDING", "expiresAt": later},
        {"_id": "claimed", "attemptId": "a1", "state": "HELD", "expiresAt": later},
    ])
    entries_ = [booking(token="unclaimed"), booking(user="u2", token="claimed")]
    missing, past, late = slots.orphans(entries_, now, ["unclaimed", "claimed", "released"])
    assert (missing, past, late) == ([], [], ["unclaimed"])


def test_given_create_on_an_existing_counter_then_it_changes_nothing():
    slots.create(USER, "res")
    assert counts() == {USER.key: (0, [])}
    slots.take([USER], booking(), "res", gate_key="other")
    slots.create(USER, "res")
    assert counts() == {USER.key: (1, [booking()])}


@pytest.mark.parametrize("specs", [[], [USER]])
def test_given_nothing_to_give_back_then_no_counter_is_touched(specs):
    slots.take([USER, PROJECT], booking(), "res", gate_key="other")
    before = counts()
    assert slots.give_back([], booking()) is None
    assert slots.give_back([s.key for s in specs], booking(user="nobody", token="none")) is None
    assert counts() == before
