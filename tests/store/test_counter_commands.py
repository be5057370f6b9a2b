"""leases.store.counter_commands: what each counter command builds (pure, no store)."""

from __future__ import annotations

from datetime import datetime

from pymongo import UpdateOne

from leases.store import counter_commands as commands

SEED = commands.seed(resource="res", level="global", scope="*", tenant_id=None, cap=3)


def test_given_a_newcomer_at_the_gate_then_it_books_under_the_cap_once_and_only_while_nobody_queues():
    query, update = commands.take_slot("g", "t/p/u/a/tok", cap=3, seeded=SEED, gate=True)
    # Then: never above cap, never the same entry twice, no barging past a queue (its head
    # in the gate, nor its backlog the gate counts).
    assert query == {"_id": "g", "count": {"$lt": 3}, "holders": {"$ne": "t/p/u/a/tok", "$exists": True},
                     "queue.0": {"$exists": False}, "bk": {"$not": {"$gt": 0}}}
    # And: the push and the count move together; a first use creates the counter.
    assert update == {"$push": {"holders": "t/p/u/a/tok"}, "$inc": {"count": 1}, "$currentDate": {"updatedAt": True},
                      "$setOnInsert": SEED}


def test_given_a_picked_ticket_then_its_booking_needs_it_queued_dequeues_it_and_charges_its_share():
    query, update = commands.take_slot("g", "e", cap=2, seeded=SEED, gate=True, privileged=True, ticket="tok",
                                       charge={"$inc": {"vt.t": 1}, "$max": {"vf": 2}},
                                       clauses=[{"c": 1}], record={"fence.s0": {"e": "e", "g": 5}})
    assert query["queue"] == {"$elemMatch": {"id": "tok"}} and "queue.0" not in query
    assert query["$and"] == [{"c": 1}]
    assert update["$pull"] == {"queue": {"id": "tok"}}
    assert update["$inc"] == {"count": 1, "vt.t": 1} and update["$max"] == {"vf": 2}
    assert update["$set"] == {"fence.s0": {"e": "e", "g": 5}}


def test_given_a_narrow_level_then_no_queue_clause_is_added():
    query, update = commands.take_slot("n", "e", cap=1, seeded=SEED)
    assert set(query) == {"_id", "count", "holders"} and set(update) == {"$push", "$inc", "$currentDate",
                                                                          "$setOnInsert"}


def test_given_a_booking_when_returning_it_then_the_pull_is_by_entry_value():
    # Then: only a counter still listing the entry matches, so a slot comes back at most once.
    assert commands.pull("k", "e") == ({"_id": "k", "holders": "e"}, {
        "$pull": {"holders": "e"}, "$inc": {"count": -1}, "$unset": {"claims.e": ""},
        "$currentDate": {"updatedAt": True, "clock": True}})
    query, update = commands.gate_pull("g", "e", {"$push": {"holds": 1}})
    assert query == {"_id": "g", "holders": "e"} and update["$push"] == {"holds": 1}
    assert [op._filter for op in commands.pull_ops(["a", "b"], "e")] == [{"_id": "a", "holders": "e"},
                                                                        {"_id": "b", "holders": "e"}]


def test_given_a_missing_counter_then_create_is_a_pure_id_upsert():
    assert commands.create("k", SEED) == ({"_id": "k"}, {"$setOnInsert": {"count": 0, "holders": [], **SEED}})


def test_given_a_view_newer_than_the_stamp_then_the_cap_refresh_never_upserts():
    op = commands.refresh_cap("k", 4, {"capStamps.res.at": {"$exists": False}})
    assert isinstance(op, UpdateOne) and not op._upsert
    assert op._filter == {"_id": "k", "cap": {"$ne": 4}, "capStamps.res.at": {"$exists": False}}


def test_given_a_definition_write_then_the_stamp_sets_cap_and_time():
    assert commands.stamp_cap("k", "res", 2) == ({"_id": "k"}, {
        "$set": {"cap": 2, "capStamps.res.cap": 2}, "$currentDate": {"capStamps.res.at": True}})


def test_given_a_booking_of_a_lease_then_the_counter_it_creates_is_born_pending_and_only_a_settle_ends_that():
    born = commands.seed(resource="res", level="user", scope="t/u", tenant_id="t", cap=5, lease="res")
    # Born bound to its creator's entry alone (cap 1), whatever the creator's view says.
    assert born["cap"] == 1 and born["capStamps"] == {"res": {"cap": 1, "at": commands.PENDING_AT}}
    # The settle is the stamp, matching only while the stamp is still the pending one.
    assert commands.settle_cap("k", "res", 4) == ({"_id": "k", "capStamps.res.at": commands.PENDING_AT},
                                                  commands.stamp_cap("k", "res", 4)[1])


def test_given_a_counter_as_read_then_corrections_match_only_that_version():
    at = datetime(2026, 12, 5, 8)
    doc = {"_id": "k", "count": 4, "updatedAt": at}
    assert commands.recount(doc, 2) == ({"_id": "k", "count": 4, "updatedAt": at},
                                        {"$set": {"count": 2}, "$currentDate": {"updatedAt": True}})
    assert commands.drop_idle(doc)["fence"] == {"$exists": False}
    guard, update = commands.convert_legacy({"_id": "k", "count": 1}, ["e"])
    assert guard == {"_id": "k", "holders": {"$exists": False}, "count": 1, "updatedAt": {"$exists": False}}
    assert update["$set"] == {"holders": ["e"], "count": 1}


def test_given_a_fence_proposal_then_the_clause_needs_the_slot_free_and_the_generation_newer():
    clause = commands.fence_clause("$fence.s1", 9)
    free, newer = clause["$expr"]["$and"]
    assert free == {"$not": [{"$in": [{"$ifNull": ["$fence.s1.e", None]}, {"$ifNull": ["$holders", []]}]}]}
    assert newer == {"$lt": [{"$ifNull": ["$fence.s1.g", 0]}, 9]}
    assert commands.fence_record("fence.s1", "e", 9) == {"fence.s1": {"e": "e", "g": 9}}
