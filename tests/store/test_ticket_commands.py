"""leases.store.ticket_commands and the tombstone builders: what each builds (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta

from leases.store import ticket_commands as commands, tombstones

NOW = datetime(2026, 12, 5, 8)


def test_given_a_ticket_then_enqueue_pushes_it_only_when_its_id_is_not_queued():
    assert commands.enqueue("g", {"id": "tok", "t": "a"}) == (
        {"_id": "g", "queue.id": {"$ne": "tok"}}, {"$push": {"queue": {"id": "tok", "t": "a"}},
                                                   "$currentDate": {"clock": True}})


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
