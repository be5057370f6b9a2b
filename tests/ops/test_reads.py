"""leases.ops.reads: tenant-bound holder and counter reads, BOOKED/drift, merged definitions, waiting tickets."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import leases
from leases.definitions import (
    cache as definition_cache,
    invalidation,
    layers as config,
    model as definitions,
    view as definition_views,
)
from leases.definitions.model import document_path
from leases.errors import HolderNotFound, InvalidLeaseRequest
from leases.ops import reads
from leases.pods.identity import self_pod_id
from leases.queue import estimates
from leases.store import client as store
from tests.helpers import counted_commands, hold, operator_leases, queue_up as helpers_queue_up


@pytest.fixture(autouse=True)
def handler():
    with operator_leases() as recording:
        yield recording



def test_given_two_tenants_when_listing_one_then_only_its_holders_come_back_with_server_ttl():
    mine = [hold(user="alice"), hold(project="web", user="bob")]
    hold(tenant="globex", project="research", user="dave")

    page = reads.list_holders(tenant_id="acme")

    assert {h.token for h in page.items} == {lease.token for lease in mine}
    assert page.total == 2 and all(h.tenant_id == "acme" for h in page.items)
    first = page.items[0]
    assert first.resource == "opres" and first.type == "optest" and first.state == "HELD"
    assert 0 < first.ttl_remaining_seconds <= 60
    assert first.pod_state == "alive"  # this process's own pod is always alive


def test_given_filters_then_they_combine_and_detached_pods_are_shown_as_such():
    a = hold(user="alice", pod="")
    hold(project="web", user="alice")
    hold(user="bob")

    page = reads.list_holders(tenant_id="acme", project_id="docs", user_id="alice")

    assert [h.token for h in page.items] == [a.token]
    assert page.items[0].pod_state == "detached"
    assert reads.list_holders(tenant_id="acme", type="optest", resource="opres").total == 3
    assert reads.list_holders(tenant_id="acme", pod=self_pod_id()).total == 2


def test_given_many_holders_when_paging_then_pages_are_disjoint_and_complete():
    tokens = {hold(user=f"u{i}").token for i in range(5)}

    pages = [reads.list_holders(tenant_id="acme", page=n, per_page=2) for n in (1, 2, 3)]

    seen = [h.token for p in pages for h in p.items]
    assert len(seen) == 5 and set(seen) == tokens
    assert pages[0].pages == 3 and pages[0].has_next and not pages[2].has_next and pages[2].has_previous


@pytest.mark.parametrize("kwargs", [
    {"tenant_id": {"$ne": ""}}, {"tenant_id": "acme.x"}, {"resource": "$where"}, {"pod": "a b"},
    {"type": "x/y"}, {"project_id": "../p"}, {"user_id": "u\x00"}, {"page": 0}, {"per_page": 10_000},
    {"page": "two"},
])
def test_given_malformed_filters_then_typed_error_before_any_query(kwargs):
    hold()
    with pytest.raises(InvalidLeaseRequest):
        reads.list_holders(**kwargs)


def test_given_a_token_of_another_tenant_then_get_holder_says_not_found():
    theirs = hold(tenant="globex", project="research", user="dave")

    with pytest.raises(HolderNotFound):
        reads.get_holder(theirs.token, tenant_id="acme")
    assert reads.get_holder(theirs.token).tenant_id == "globex"
    with pytest.raises(InvalidLeaseRequest):
        reads.get_holder({"$ne": ""})


def test_given_counters_then_tenant_view_has_no_global_level_and_booked_matches():
    hold(user="alice")
    hold(project="web", user="alice")
    hold(tenant="globex", project="research", user="dave")

    mine = {c.key: c for c in reads.list_counters(tenant_id="acme")}
    everything = {c.key: c for c in reads.list_counters()}

    assert set(mine) == {"opres|tenant|acme", "opres|project|acme/docs", "opres|project|acme/web", "opres|user|acme/alice"}
    assert mine["opres|user|acme/alice"].count == mine["opres|user|acme/alice"].booked == 2
    assert not any(c.drift for c in mine.values())
    assert everything["opres|global|*"].count == everything["opres|global|*"].booked == 3
    assert "opres|tenant|globex" in everything
    assert "opres|global|*" not in {c.key for c in reads.list_counters(include_global=False)}


def test_given_a_crash_window_drift_then_counter_shows_it_against_booked():
    hold(user="alice")
    store.counters().update_one({"_id": "opres|tenant|acme"}, {"$inc": {"count": 2}})

    row = {c.key: c for c in reads.list_counters(tenant_id="acme")}["opres|tenant|acme"]

    assert (row.count, row.booked, row.drift) == (3, 1, True)
    assert row.to_dict()["drift"] is True


def test_given_a_lease_answered_before_its_holder_is_marked_then_its_slot_counts_as_booked(settings):
    # Given: a one-slot lease handed over by a release; the waiter has its lease, its holder
    # is still PENDING (its mark is due later).
    from tests.helpers import define, lease_request

    settings.LEASES_GRANT_MARK_DELAY_MS = 250
    define("opone", "resource: opone\nlevels: {global: 1}\nwaitMs: 10000\nttlSeconds: 60")
    held = leases.acquire(lease_request("opone", lease_type="optest", user="h"))
    waiter = helpers_queue_up(lease_request("opone", lease_type="optest", user="w"), "opone|global|*")
    held.release()
    waiter.join(10)
    assert waiter.lease is not None
    assert store.holders().find_one({"_id": waiter.lease.token})["state"] == "PENDING"
    # When: an operator lists the counters. Then: the slot is booked, not drift — it is what
    # reconcile keeps (the entry's holder exists as the entry names it).
    row = {c.key: c for c in reads.list_counters()}["opone|global|*"]
    assert (row.count, row.booked, row.drift) == (1, 1, False)
    waiter.lease.release()


def test_definition_view_names_the_layer_of_each_field_and_discards_the_cache_first(settings):
    config.put_document("acme", "_tenant", document_path("oplease"), "levels: {tenant: 7}\nttlSeconds: 90")
    config.put_document("acme", "docs", document_path("oplease"), "levels: {project: 3, tenant: 99}")
    # Plant a stale cache entry, as a process off the change-event chain could hold one.
    stale = definitions.merge("oplease", {"classpath": {"levels.user": 1}})
    assert invalidation.wait_listening()
    definitions.cache._entries[("acme", "docs", "oplease")] = definition_cache._Entry(stale, 10**12, definitions.cache.live_epoch())

    view = definition_views.definition_view("oplease", "acme", "docs")

    fields = {f.field: (f.value, f.layer) for f in view.fields}
    assert fields["resource"] == ("opres", "system")
    assert fields["levels.global"] == (50, "system")
    assert fields["levels.tenant"] == (7, "tenant")        # the project layer may not set it
    assert fields["levels.project"] == (3, "project")
    assert fields["levels.user"] == (5, "system")
    assert fields["ttlSeconds"] == (90, "tenant")
    assert fields["waitMs"] == (0, "default")
    assert ("acme", "docs", "oplease") not in definitions.cache._entries
    with pytest.raises(InvalidLeaseRequest):
        definition_views.definition_view("../x", "acme", "docs")


def test_given_a_name_no_layer_defines_then_the_definition_view_says_it_is_not_defined():
    # given: oplease in the System layer (the fixture), nothing for "nosuchlease"
    defined = definition_views.definition_view("oplease", "acme", "docs")
    undefined = definition_views.definition_view("nosuchlease", "acme", "docs")

    # then: only the built-in defaults and unset levels make a name undefined
    assert defined.defined is True and undefined.defined is False
    assert {f.layer for f in undefined.fields} <= {"default", "unset"} and undefined.noop


# --- waiting tickets ------------------------------------------------------------------------

@pytest.fixture
def steady_tickets(settings):
    """Tickets that stay fresh for 30 s: a keep-alive delayed on a loaded machine must not
    make a ticket "suspect" (sent behind the fresh ones) and so change the positions."""
    settings.LEASES_TICKET_TTL_MS = 30_000


def queue_up(tenant, project, user, key="wqres|global|*", lease="wqlease"):
    """Start a waiter and return once its ticket is queued (so arrival order is fixed)."""
    return helpers_queue_up(leases.LeaseRequest(type="optest", lease=lease, tenant_id=tenant, project_id=project,
                                                user_id=user, pod="", wait_ms=30_000), key)


def finish(held, waiters):
    """Free the held slots until every waiter got and returned its lease (in whatever order
    the order rule grants them: it need not be the order they queued in)."""
    for lease in held:
        lease.release()
    pending = list(waiters)
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        for waiter in [w for w in pending if not w.is_alive()]:
            assert waiter.lease is not None, waiter.error
            waiter.lease.release()
            pending.remove(waiter)
        time.sleep(0.01)
    assert not pending, [w.request.user_id for w in pending]


def wq_hold(tenant, project, user):
    return leases.acquire(leases.LeaseRequest(type="optest", lease="wqlease", tenant_id=tenant, project_id=project,
                                              user_id=user, pod="", wait_ms=0))


def test_given_tickets_of_two_tenants_when_one_tenant_lists_then_only_its_own_with_places_in_the_whole_queue(steady_tickets):
    config.put_document("_vance", "_tenant", document_path("wqlease"),
                        "resource: wqres\nlevels: {global: 2, user: 2}\nttlSeconds: 60\nwaitMs: 30000")
    held = [wq_hold("globex", "research", "g1"), wq_hold("globex", "research", "g2")]  # global full
    waiters = [queue_up("globex", "research", "g3"), queue_up("acme", "docs", "alice"),
               queue_up("acme", "web", "bob")]
    try:
        mine = reads.list_waiters(tenant_id="acme")
        everyone = reads.list_waiters()
    finally:
        finish(held, waiters)

    # acme holds nothing and globex two: acme's two go first although globex's g3 is older.
    assert [(w.user_id, w.position) for w in mine.items] == [("alice", 1), ("bob", 2)]
    assert all(w.tenant_id == "acme" and w.level == "global" and w.shared_level for w in mine.items)
    # No number of the shared level, no other tenant's ticket, person or id.
    assert all(w.blocked_count is None and w.blocked_cap is None and w.blocked_key is None for w in mine.items)
    text = repr(mine.to_dict())
    # "g3" is short enough to turn up inside a random token, so compare whole values, not substrings.
    values = {str(v) for item in mine.to_dict()["items"] for v in item.values()}
    assert "globex" not in text and not values & {"globex", "research", "g3"}
    assert all(w.waiting_since <= mine.server_now for w in mine.items)
    # The operator sees all three, with the global level's numbers.
    assert [(w.tenant_id, w.user_id, w.position) for w in everyone.items] == [
        ("acme", "alice", 1), ("acme", "bob", 2), ("globex", "g3", 3)]
    assert {(w.blocked_key, w.blocked_count, w.blocked_cap) for w in everyone.items} == {("wqres|global|*", 2, 2)}
    assert reads.list_waiters(tenant_id="initech").items == []


def test_given_the_operator_narrows_waiters_to_a_tenant_then_its_rows_keep_the_shared_numbers(steady_tickets):
    # given: globex fills the global level, then globex and acme queue
    config.put_document("_vance", "_tenant", document_path("wqlease"),
                        "resource: wqres\nlevels: {global: 1, user: 2}\nttlSeconds: 60\nwaitMs: 30000")
    held = [wq_hold("globex", "research", "g1")]
    waiters = [queue_up("globex", "research", "g2"), queue_up("acme", "docs", "alice")]
    try:
        # when: the operator narrows to acme (the CLI's ``waiters --tenant acme``)
        narrowed = reads.operator_waiters(tenant_id="acme")
        everyone = reads.operator_waiters()
        tenants_own = reads.list_waiters(tenant_id="acme")
    finally:
        finish(held, waiters)

    # then: only acme's row, with its place in the whole queue and the global level's numbers,
    # which the tenant's own view never carries
    assert [(w.tenant_id, w.user_id) for w in narrowed.items] == [("acme", "alice")]
    (mine,) = narrowed.items
    assert mine.position == next(w.position for w in everyone.items if w.user_id == "alice")
    assert (mine.blocked_key, mine.blocked_count, mine.blocked_cap) == ("wqres|global|*", 1, 1)
    assert [(w.blocked_count, w.blocked_cap) for w in tenants_own.items] == [(None, None)]
    assert len(everyone.items) == 2
    with pytest.raises(InvalidLeaseRequest):
        reads.operator_waiters(tenant_id="$ne")


def test_given_a_ticket_blocked_at_its_own_user_level_then_the_tenant_sees_that_level_with_its_numbers(steady_tickets):
    config.put_document("_vance", "_tenant", document_path("wqlease"),
                        "resource: wqres\nlevels: {global: 5, user: 1}\nttlSeconds: 60\nwaitMs: 30000")
    held = [wq_hold("acme", "docs", "alice")]
    waiters = [queue_up("acme", "docs", "alice")]
    try:
        (row,) = reads.list_waiters(tenant_id="acme", resource="wqres").items
        assert reads.list_waiters(tenant_id="acme", resource="otherres").items == []
    finally:
        finish(held, waiters)
    assert (row.level, row.shared_level, row.blocked_key) == ("user", False, "wqres|user|acme/alice")
    assert (row.blocked_count, row.blocked_cap, row.position) == (1, 1, 1)


def test_given_a_full_global_level_then_only_the_resource_name_is_flagged():
    config.put_document("_vance", "_tenant", document_path("wqlease"),
                        "resource: wqres\nlevels: {global: 1, user: 1}\nttlSeconds: 60")
    hold(user="alice")  # opres: global 50, far from full
    held = wq_hold("globex", "research", "g1")
    assert reads.globally_full(["wqres", "opres", "nosuch"]) == {"wqres"}
    held.release()
    assert reads.globally_full(["wqres"]) == set()
    assert reads.globally_full([]) == set()


@pytest.mark.parametrize("kwargs", [{"tenant_id": {"$ne": ""}}, {"resource": {"$gt": ""}}, {"tenant_id": "a/b"}])
def test_given_operator_like_waiter_filters_then_typed_error_before_any_query(kwargs):
    with pytest.raises(InvalidLeaseRequest):
        reads.list_waiters(**kwargs)
    with pytest.raises(InvalidLeaseRequest):
        reads.globally_full([{"$ne": ""}])


def test_given_a_counter_key_then_holders_are_those_booking_it_and_a_bad_key_is_refused():
    a = hold(user="alice")
    hold(project="web", user="bob")
    page = reads.list_holders(tenant_id="acme", books="opres|project|acme/docs")
    assert [h.token for h in page.items] == [a.token]
    for bad in ({"$ne": ""}, "opres|project|acme", "opres|global|acme", "a|b", "opres|project|acme/$x", "opres|user|acme/a b",
                "opres|user|acme/a%2x"):
        with pytest.raises(InvalidLeaseRequest):
            reads.list_holders(tenant_id="acme", books=bad)


def test_given_waiters_blocked_at_the_global_level_then_the_tenant_view_costs_one_find_and_a_clock_read(steady_tickets):
    config.put_document("_vance", "_tenant", document_path("wqlease"),
                        "resource: wqres\nlevels: {global: 1, user: 5}\nttlSeconds: 60\nwaitMs: 30000")
    held = [wq_hold("globex", "research", "g1")]
    waiters = [queue_up("acme", "docs", f"u{n}") for n in range(3)] + [queue_up("globex", "research", "g2")]
    try:
        with counted_commands() as counter:
            mine = reads.list_waiters(tenant_id="acme")
            # The waiters' own keep-alives run meanwhile (findAndModify); count the reads.
            read_commands = [c for c in counter.commands if c != "findAndModify"]
    finally:
        finish(held, waiters)
    # Tenants alternate (pass + held ÷ weight): acme's u0 first (globex holds g1), then
    # globex's g2 (acme's pass was charged by u0's grant), then acme's u1 and u2.
    assert [(w.user_id, w.position) for w in mine.items] == [("u0", 1), ("u1", 3), ("u2", 4)]
    # One find for the queues and MongoDB's clock; the global level's numbers are not even read.
    assert sorted(read_commands) == ["find", "hello"], read_commands


def test_given_a_gate_with_calibration_on_record_then_the_listing_shows_the_calibrated_estimate(steady_tickets):
    config.put_document("_vance", "_tenant", document_path("wqlease"),
                        "resource: wqres\nlevels: {global: 1, user: 5}\nttlSeconds: 60\nwaitMs: 30000")
    held = [wq_hold("globex", "research", "g1")]
    waiters = [queue_up("acme", "docs", f"u{n}") for n in range(2)]
    # A typical hold of 1 s, and estimates that came out twice as long as walked.
    store.counters().update_one({"_id": "wqres|global|*"},
                                {"$set": {"holds": [1000.0] * 3, "er": [2.0, 2.0, 2.0]}})
    try:
        listing = reads.list_waiters(tenant_id="acme")
        gate = store.counters().find_one({"_id": "wqres|global|*"})
    finally:
        finish(held, waiters)
    now = listing.server_now
    # The waiter's own 202 body and LeaseBusy compute it from the whole gate document.
    expected = {w.ticket: estimates.grant_at(gate, w.ticket, now) for w in waiters}
    assert {w.ticket_id: w.estimated_grant_at for w in listing.items} == expected
    # u0 is first behind one holder of cap 1: half a hold, doubled by the calibration.
    assert expected[waiters[0].ticket] == now + timedelta(milliseconds=1000)
