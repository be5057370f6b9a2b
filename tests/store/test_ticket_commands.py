"""leases.store.ticket_commands and the tombstone builders: what each builds (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta

from leases.store import ticket_commands as commands, tombstones

NOW = datetime(2026, 12, 5, 8)


def test_given_a_ticket_then_enqueue_pushes_it_only_when_its_id_is_not_queued_and_nobody_waits_in_the_backlog():
    assert commands.enqueue("g", {"id": "tok", "t": "a"}) == (
        {"_id": "g", "queue.id": {"$ne": "tok"}, "bk": {"$not": {"$gt": 0}}},
        {"$push": {"queue": {"id": "tok", "t": "a"}}, "$currentDate": {"clock": True}})


def test_given_a_head_limit_then_enqueue_pushes_only_into_a_head_below_it():
    query, _ = commands.enqueue("g", {"id": "tok"}, limit=32)
    assert query["queue.31"] == {"$exists": False}


def test_given_an_undone_grant_then_requeue_queues_its_ticket_only_with_its_gate_entry_pulled():
    query, update = commands.requeue("g", "a/p/u/at1/tok", {"id": "tok", "t": "a"}, fence_slot="fence.s1")
    # Only while the gate books the entry (nobody gave it back first) and the ticket is not queued.
    assert query == {"_id": "g", "holders": "a/p/u/at1/tok", "queue.id": {"$ne": "tok"}}
    assert update["$pull"] == {"holders": "a/p/u/at1/tok"} and update["$inc"] == {"count": -1}
    assert update["$push"] == {"queue": {"id": "tok", "t": "a"}}
    assert update["$set"] == {"fence.s1.e": ""}  # the slot freed, its generation kept
    assert update["$currentDate"]["clock"] is True


def test_given_a_kept_ticket_then_keep_alive_matches_only_a_ticket_live_at_the_time_given():
    query, update = commands.keep_alive("g", "tok", ttl_ms=3000, live_at=NOW)
    assert query == {"_id": "g", "queue": {"$elemMatch": {"id": "tok", "seen": {"$gte": NOW - timedelta(seconds=3)}}}}
    assert update["$set"] == {"queue.$[mine].ttl": 3000, "queue.$[mine].w": None}
    assert commands.mine("tok") == [{"mine.id": "tok"}]
    assert commands.keep_alive("g", "tok") == ({"_id": "g", "queue.id": "tok"},
                                               {"$currentDate": {"queue.$[mine].seen": True, "clock": True}})


def test_given_ids_then_dequeue_and_prune_pull_by_id_and_drop_only_pending_holders():
    assert commands.dequeue("g", "tok") == ({"_id": "g"}, {"$pull": {"queue": {"id": "tok"}}})
    assert commands.prune("g", ["a", "b"])[1]["$pull"] == {"queue": {"id": {"$in": ["a", "b"]}}}
    assert commands.pruned_holders(["a"]) == {"_id": {"$in": ["a"]}, "state": "PENDING"}
    assert commands.mark_blocked("g", "tok", "user")[1] == {"$set": {"queue.$[mine].lvl": "user"},
                                                            "$currentDate": {"queue.$[mine].bat": True}}


def test_given_a_counter_check_then_the_claim_matches_only_the_checked_at_as_read():
    assert commands.repair_claim("k", None) == ({"_id": "k", "checkedAt": None}, {"$currentDate": {"checkedAt": True}})
    assert commands.expired_holder("tok", NOW) == {"_id": "tok", "expiresAt": {"$lt": NOW}}


def test_given_pruned_tickets_then_their_tombstones_name_who_waited_and_a_stranger_records_none():
    gate = {"_id": "g", "resource": "res", "queue": [{"id": "a", "t": "$t", "p": "p1"}]}
    ops = tombstones.ticket_tombstones(gate, ["a", "b"], "ticket-expired")
    first, second = (op._doc[0]["$set"] for op in ops)
    assert first["tenantId"] == {"$literal": "$t"} and first["projectId"] == {"$literal": "p1"}
    assert second["tenantId"] == {"$literal": None} and second["resource"] == {"$literal": "res"}
    assert all(op._upsert for op in ops)


def test_given_a_dispatch_then_the_claim_matches_only_an_unclaimed_tombstone_and_keeps_its_time():
    query, pipeline = tombstones.claim({"_id": "tok", "tenantId": "t", "projectId": "p", "resource": "r"}, "idle",
                                       "pod-1")
    assert query == {"_id": "tok", "handledBy": {"$exists": False}}
    assert pipeline[0]["$set"]["at"] == {"$ifNull": ["$at", "$$NOW"]}
    assert pipeline[0]["$set"]["handledBy"] == {"$literal": "pod-1"}


def test_given_a_release_and_a_pick_then_swap_replaces_the_entry_only_on_the_gate_as_read():
    query, update = commands.swap("g", released="a/p/u/x/rel", holders=["a/p/u/x/rel", "b/p/u/y/other"],
                                  booking="c/p/u/z/tok", ticket_id="tok", cap=2, slot_field="fence.s0",
                                  slot_seen={"e": "a/p/u/x/rel", "g": 7}, charge={"$inc": {"vt.c": 1.0}},
                                  record={"fence.s0": {"e": "c/p/u/z/tok", "g": 8}},
                                  more={"$push": {"holds": {"$each": [100.0], "$slice": -20}}}, claimed_by="tok")
    # The entries exactly as read, the cap and count read, the ticket queued, the fence slot as read.
    assert query == {"_id": "g", "holders": ["a/p/u/x/rel", "b/p/u/y/other"], "cap": 2, "count": 2,
                     "queue.id": "tok", "fence.s0.e": "a/p/u/x/rel", "fence.s0.g": 7}
    # One entry out, one in: the count is not touched; the ticket leaves the queue, is charged,
    # its fence recorded and its claim window started; the releaser's claim (if any) cleared.
    assert update["$set"] == {"holders": ["b/p/u/y/other", "c/p/u/z/tok"], "fence.s0": {"e": "c/p/u/z/tok", "g": 8}}
    assert "count" not in update.get("$inc", {}) and update["$inc"] == {"vt.c": 1.0}
    assert update["$pull"] == {"queue": {"id": "tok"}} and update["$unset"] == {"claims.rel": ""}
    assert update["$currentDate"] == {"updatedAt": True, "clock": True, "claims.tok": True}
    assert update["$push"] == {"holds": {"$each": [100.0], "$slice": -20}}
    assert commands.swap("g", released="r", holders=["r"], booking="n", ticket_id="t", cap=1, slot_field="fence.s0",
                         slot_seen=None, charge={}, record={})[0]["fence.s0"] == {"$exists": False}
