"""leases.store.holder_commands: what each holder command builds (pure, no store)."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace

import pytest

from leases.errors import InvalidLeaseRequest
from leases.store import holder_commands as commands

DEFINITION = SimpleNamespace(resource="res", name="res", ttl_seconds=30)
REQUEST = SimpleNamespace(type="job", tenant_id="$where", project_id="p1", user_id="{$ne: 1}", holder_ref="$x",
                          pod_bound=False)


def test_given_user_strings_when_writing_the_holder_then_each_is_a_literal_and_times_are_the_servers():
    # When: the PENDING holder of a request whose ids look like operators and field paths.
    query, pipeline = commands.holder_upsert("tok", definition=DEFINITION, request=REQUEST, pod="pod-1",
                                             keys=["k1", "k2"], attempt_id="a1", interval_seconds=10)
    fields = pipeline[0]["$set"]
    # Then: the filter is the token alone, every user value is a $literal, times are $$NOW.
    assert query == {"_id": "tok"}
    assert fields["tenantId"] == {"$literal": "$where"} and fields["userId"] == {"$literal": "{$ne: 1}"}
    assert fields["holderRef"] == {"$literal": "$x"} and fields["keys"] == {"$literal": ["k1", "k2"]}
    assert fields["intervalSeconds"] == {"$literal": 10} and fields["state"] == "PENDING"
    assert fields["acquiredAt"] == fields["lastSeenAt"] == "$$NOW"
    assert fields["expiresAt"] == {"$add": ["$$NOW", 30000]}


def test_given_an_attempt_when_marking_held_then_only_that_attempts_holder_matches():
    query, pipeline = commands.mark_held("tok", keys=["k"], ttl_seconds=5, attempt_id="a2", fence="F")
    # ... and only for a grant nobody undid (issue 34, item 6: grant_undone).
    assert query == {"_id": "tok", "attemptId": "a2", "undoneGrants": {"$ne": "F"}}
    assert pipeline[0]["$set"]["state"] == "HELD" and pipeline[0]["$set"]["fence"] == {"$literal": "F"}
    assert pipeline[0]["$set"]["expiresAt"] == {"$add": ["$$NOW", 5000]}


def test_given_a_grant_time_when_marking_held_then_the_ttl_runs_from_the_grant():
    from datetime import datetime, timedelta

    at = datetime(2026, 12, 6, 2, 0, 0, 123000)
    fields = commands.mark_held("tok", keys=["k"], ttl_seconds=5, attempt_id="a2", granted_at=at)[1][0]["$set"]
    assert fields["lastSeenAt"] == {"$literal": at}
    assert fields["expiresAt"] == {"$literal": at + timedelta(seconds=5)} and fields["heldAt"] == "$$NOW"


def test_given_a_payload_when_renewing_then_it_is_a_literal_set_only_on_a_live_holder():
    # When: a renewal with a payload whose strings look like field paths, and an interval.
    interval = {"$toInt": 7}
    query, pipeline = commands.renewal({"_id": "tok", "tenantId": "t"}, payload={"a": "$b"}, interval=interval)
    update = pipeline[0]["$set"]
    # Then: it matches only a HELD holder in the caller's scope; the payload and interval are
    # each kept as they were unless the holder is live; the old deadline is kept aside.
    assert query == {"_id": "tok", "tenantId": "t", "state": "HELD"}
    assert update["payload"]["$cond"][1:] == [{"$literal": {"a": "$b"}}, "$payload"]
    assert update["intervalSeconds"]["$cond"][1:] == [interval, "$intervalSeconds"]
    assert update["expiresAt"]["$cond"][2] == "$expiresAt" and update["priorExpiresAt"] == "$expiresAt"


def test_given_no_payload_nor_interval_when_renewing_then_neither_is_touched():
    _, pipeline = commands.renewal({"_id": "tok"})
    assert set(pipeline[0]["$set"]) == {"priorExpiresAt", "lastSeenAt", "expiresAt"}


def test_given_a_later_prior_deadline_then_keep_later_takes_the_maximum():
    prior = datetime(2026, 12, 5, 9, 0)
    assert commands.keep_later("tok", prior) == ({"_id": "tok", "state": "HELD"},
                                                 [{"$set": {"expiresAt": {"$max": ["$expiresAt", prior]}}}])


def test_given_a_release_then_the_deletion_projects_what_the_give_back_needs_and_a_reap_keeps_all():
    assert commands.deletion({"_id": "tok"}, "release") == ({"_id": "tok"}, commands.RELEASE_PROJECTION)
    assert commands.deletion({"_id": "tok"}, "idle") == ({"_id": "tok"}, None)


def test_given_a_ticket_then_only_a_pending_holder_is_dropped_or_polled():
    assert commands.pending_deletion({"_id": "tok", "tenantId": "t"}) == {"_id": "tok", "tenantId": "t",
                                                                          "state": "PENDING"}
    query, pipeline = commands.poll_ticket({"_id": "tok"}, 5000)
    assert query == {"_id": "tok", "state": "PENDING"}
    # Polled in time: the deadline is the poll deadline (not the lease's TTL); after it, the
    # deadline stays as it was (a late poll revives nothing).
    _, in_time, late = pipeline[0]["$set"]["expiresAt"]["$cond"]
    assert in_time == {"$add": ["$$NOW", 5000]} and late == "$expiresAt"


def test_given_a_scope_then_the_filter_binds_the_tenant_and_project():
    assert commands.scoped("tok", commands.scope("t1", "p1")) == {"_id": "tok", "tenantId": "t1", "projectId": "p1"}
    assert commands.ended_lookup("tok", commands.scope("t1")) == ({"_id": "tok", "tenantId": "t1"}, {"reason": 1})


@pytest.mark.parametrize("bound", [{"tenantId": {"$ne": "x"}}, {"userId": "u"}, {"tenantId": ""}])
def test_given_an_operator_or_a_foreign_field_in_a_scope_then_it_is_refused(bound):
    with pytest.raises(InvalidLeaseRequest):
        commands.scoped("tok", bound)


def test_given_a_held_lease_then_adopt_moves_only_a_held_one():
    assert commands.adopt("tok", pod="p2") == ({"_id": "tok", "state": "HELD"}, {"$set": {"pod": "p2"}})


def test_given_a_grant_being_undone_then_only_a_pending_holder_of_that_attempt_records_it():
    query, update = commands.grant_undone("tok", "a2", "F")
    assert query == {"_id": "tok", "attemptId": "a2", "state": "PENDING"}
    assert update == {"$addToSet": {"undoneGrants": "F"}}
    # A mark of that grant then matches nothing; one without a fence is not held back.
    assert commands.mark_held("tok", keys=["k"], ttl_seconds=5, attempt_id="a2", fence=None)[0] == {
        "_id": "tok", "attemptId": "a2"}
