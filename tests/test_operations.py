"""leases.operations: tenant-bound reads, BOOKED/drift, merged definitions, revocations."""

from __future__ import annotations


import pytest
from prometheus_client import REGISTRY

import leases
from leases import config, definitions, dispatch, handlers, invalidation, listener, operations, store
from leases.definitions import document_path
from leases.errors import AuditEntryNotFound, HolderNotFound, InvalidLeaseRequest, LeaseLost
from leases.identity import self_pod_id
from tests.helpers import counted_commands, queue_up as helpers_queue_up


class RecordingHandler(handlers.LeaseHandler):
    type = "optest"

    def __init__(self):
        self.revoked = []

    def on_revoked(self, holder):
        self.revoked.append(holder)


@pytest.fixture(autouse=True)
def handler():
    h = handlers.register_handler(RecordingHandler())
    config.put_document("_vance", "_tenant", document_path("oplease"),
                        "resource: opres\nlevels: {global: 50, tenant: 20, project: 10, user: 5}\nttlSeconds: 60")
    yield h
    handlers.unregister_handler("optest")


def hold(tenant="acme", project="docs", user="alice", pod=None, ref=""):
    return leases.acquire(leases.LeaseRequest(type="optest", lease="oplease", tenant_id=tenant, project_id=project,
                                              user_id=user, pod=pod, holder_ref=ref))


def reaps(reason):
    return REGISTRY.get_sample_value("vance_lease_reap_total", {"reason": reason}) or 0.0


# --- reads ----------------------------------------------------------------------------------

def test_given_two_tenants_when_listing_one_then_only_its_holders_come_back_with_server_ttl():
    mine = [hold(user="alice"), hold(project="web", user="bob")]
    hold(tenant="globex", project="research", user="dave")

    page = operations.list_holders(tenant_id="acme")

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

    page = operations.list_holders(tenant_id="acme", project_id="docs", user_id="alice")

    assert [h.token for h in page.items] == [a.token]
    assert page.items[0].pod_state == "detached"
    assert operations.list_holders(tenant_id="acme", type="optest", resource="opres").total == 3
    assert operations.list_holders(tenant_id="acme", pod=self_pod_id()).total == 2


def test_given_many_holders_when_paging_then_pages_are_disjoint_and_complete():
    tokens = {hold(user=f"u{i}").token for i in range(5)}

    pages = [operations.list_holders(tenant_id="acme", page=n, per_page=2) for n in (1, 2, 3)]

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
        operations.list_holders(**kwargs)


def test_given_a_token_of_another_tenant_then_get_holder_says_not_found():
    theirs = hold(tenant="globex", project="research", user="dave")

    with pytest.raises(HolderNotFound):
        operations.get_holder(theirs.token, tenant_id="acme")
    assert operations.get_holder(theirs.token).tenant_id == "globex"
    with pytest.raises(InvalidLeaseRequest):
        operations.get_holder({"$ne": ""})


def test_given_counters_then_tenant_view_has_no_global_level_and_booked_matches():
    hold(user="alice")
    hold(project="web", user="alice")
    hold(tenant="globex", project="research", user="dave")

    mine = {c.key: c for c in operations.list_counters(tenant_id="acme")}
    everything = {c.key: c for c in operations.list_counters()}

    assert set(mine) == {"opres|tenant|acme", "opres|project|acme/docs", "opres|project|acme/web", "opres|user|acme/alice"}
    assert mine["opres|user|acme/alice"].count == mine["opres|user|acme/alice"].booked == 2
    assert not any(c.drift for c in mine.values())
    assert everything["opres|global|*"].count == everything["opres|global|*"].booked == 3
    assert "opres|tenant|globex" in everything
    assert "opres|global|*" not in {c.key for c in operations.list_counters(include_global=False)}


def test_given_a_crash_window_drift_then_counter_shows_it_against_booked():
    hold(user="alice")
    store.counters().update_one({"_id": "opres|tenant|acme"}, {"$inc": {"count": 2}})

    row = {c.key: c for c in operations.list_counters(tenant_id="acme")}["opres|tenant|acme"]

    assert (row.count, row.booked, row.drift) == (3, 1, True)
    assert row.to_dict()["drift"] is True


def test_definition_view_names_the_layer_of_each_field_and_discards_the_cache_first(settings):
    config.put_document("acme", "_tenant", document_path("oplease"), "levels: {tenant: 7}\nttlSeconds: 90")
    config.put_document("acme", "docs", document_path("oplease"), "levels: {project: 3, tenant: 99}")
    # Plant a stale cache entry, as a process off the change-event chain could hold one.
    stale = definitions.merge("oplease", {"classpath": {"levels.user": 1}})
    assert invalidation.wait_listening()
    definitions.cache._entries[("acme", "docs", "oplease")] = definitions._Entry(stale, 10**12, invalidation.liveness())

    view = operations.definition_view("oplease", "acme", "docs")

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
        operations.definition_view("../x", "acme", "docs")


# --- revocations -----------------------------------------------------------------------------

def test_given_a_holder_when_revoked_then_reaped_counters_returned_audited_handler_run_and_check_lost(handler):
    lease = hold(user="alice", ref="job-1")
    other = hold(user="bob")
    before = reaps("revoke")

    revoked = operations.revoke_holder(lease.token, tenant_id="acme", acting_user="ops-alice", reason="stuck")

    assert revoked.token == lease.token and revoked.reason == "revoke"
    assert store.holders().find_one({"_id": lease.token}) is None
    assert store.counters().find_one({"_id": "opres|user|acme/alice"})["count"] == 0
    assert store.counters().find_one({"_id": "opres|tenant|acme"})["count"] == 1
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "revoke"
    assert reaps("revoke") == before + 1
    audit = store.audit().find_one({"token": lease.token})
    assert audit["actor"] == "ops-alice" and audit["tenantId"] == "acme" and audit["action"] == "revoke"
    assert audit["reason"] == "stuck" and audit["at"] is not None and audit["handlerDispatched"] is True
    # The installed dispatcher runs the handler here (the holder's pod is this process).
    assert listener.get_listener() is dispatch.get_dispatcher()
    assert dispatch.get_dispatcher().drain(timeout=10)
    assert [h.token for h in handler.revoked] == [lease.token]
    with pytest.raises(LeaseLost):
        lease.check()
    other.check()  # untouched


def test_given_a_token_of_another_tenant_when_revoking_then_not_found_and_nothing_changes(handler):
    theirs = hold(tenant="globex", project="research", user="dave")

    with pytest.raises(HolderNotFound):
        operations.revoke_holder(theirs.token, tenant_id="acme", acting_user="acme-admin")

    theirs.check()
    assert store.audit().count_documents({}) == 0
    assert store.counters().find_one({"_id": "opres|tenant|globex"})["count"] == 1


@pytest.mark.parametrize("kwargs", [
    {"acting_user": None}, {"acting_user": ""}, {"acting_user": "ops", "reason": ""},
    {"acting_user": "ops", "tenant_id": {"$gt": ""}}, {"acting_user": "ops", "reason": "x" * 500},
])
def test_given_bad_revoke_input_then_typed_error_and_nothing_written(kwargs):
    lease = hold()
    with pytest.raises(InvalidLeaseRequest):
        operations.revoke_holder(lease.token, **kwargs)
    lease.check()
    assert store.audit().count_documents({}) == 0 and store.tombstones().count_documents({}) == 0


def test_given_force_when_revoking_without_dispatch_then_no_handler_runs(handler):
    lease = hold()

    operations.revoke_holder(lease.token, acting_user="cli --force", dispatch=False)

    assert dispatch.get_dispatcher().drain(timeout=10)
    assert handler.revoked == []
    assert store.audit().find_one({"token": lease.token})["handlerDispatched"] is False
    with pytest.raises(LeaseLost):
        lease.check()


def test_given_holders_on_a_pod_when_revoking_the_pod_then_all_of_its_holders_go_across_tenants(handler):
    on_pod = [hold(user="alice", pod="pod-x"), hold(tenant="globex", project="research", user="dave", pod="pod-x")]
    elsewhere = hold(user="bob", pod="pod-y")

    revoked = operations.revoke_pod("pod-x", acting_user="ops")

    assert {h.token for h in revoked} == {lease.token for lease in on_pod}
    assert store.holders().count_documents({"pod": "pod-x"}) == 0
    elsewhere.check()
    assert store.audit().count_documents({"action": "revoke-pod"}) == 2
    with pytest.raises(InvalidLeaseRequest):
        operations.revoke_pod({"$ne": ""}, acting_user="ops")
    with pytest.raises(InvalidLeaseRequest):
        operations.revoke_pod("", acting_user="ops")


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
    """Free the held slots until every waiter got and returned its lease."""
    for lease in held:
        lease.release()
    for waiter in waiters:
        waiter.join(30)
        assert waiter.lease is not None, waiter.error
        waiter.lease.release()


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
        mine = operations.list_waiters(tenant_id="acme")
        everyone = operations.list_waiters()
    finally:
        finish(held, waiters)

    # acme holds nothing and globex two: acme's two go first although globex's g3 is older.
    assert [(w.user_id, w.position) for w in mine.items] == [("alice", 1), ("bob", 2)]
    assert all(w.tenant_id == "acme" and w.level == "global" and w.shared_level for w in mine.items)
    # No number of the shared level, no other tenant's ticket, person or id.
    assert all(w.blocked_count is None and w.blocked_cap is None and w.blocked_key is None for w in mine.items)
    text = repr(mine.to_dict())
    assert "globex" not in text and "g3" not in text and waiters[0].request.user_id not in text
    assert all(w.waiting_since <= mine.server_now for w in mine.items)
    # The operator sees all three, with the global level's numbers.
    assert [(w.tenant_id, w.user_id, w.position) for w in everyone.items] == [
        ("acme", "alice", 1), ("acme", "bob", 2), ("globex", "g3", 3)]
    assert {(w.blocked_key, w.blocked_count, w.blocked_cap) for w in everyone.items} == {("wqres|global|*", 2, 2)}
    assert operations.list_waiters(tenant_id="initech").items == []


def test_given_a_ticket_blocked_at_its_own_user_level_then_the_tenant_sees_that_level_with_its_numbers(steady_tickets):
    config.put_document("_vance", "_tenant", document_path("wqlease"),
                        "resource: wqres\nlevels: {global: 5, user: 1}\nttlSeconds: 60\nwaitMs: 30000")
    held = [wq_hold("acme", "docs", "alice")]
    waiters = [queue_up("acme", "docs", "alice")]
    try:
        (row,) = operations.list_waiters(tenant_id="acme", resource="wqres").items
        assert operations.list_waiters(tenant_id="acme", resource="otherres").items == []
    finally:
        finish(held, waiters)
    assert (row.level, row.shared_level, row.blocked_key) == ("user", False, "wqres|user|acme/alice")
    assert (row.blocked_count, row.blocked_cap, row.position) == (1, 1, 1)


def test_given_a_full_global_level_then_only_the_resource_name_is_flagged():
    config.put_document("_vance", "_tenant", document_path("wqlease"),
                        "resource: wqres\nlevels: {global: 1, user: 1}\nttlSeconds: 60")
    hold(user="alice")  # opres: global 50, far from full
    held = wq_hold("globex", "research", "g1")
    assert operations.globally_full(["wqres", "opres", "nosuch"]) == {"wqres"}
    held.release()
    assert operations.globally_full(["wqres"]) == set()
    assert operations.globally_full([]) == set()


@pytest.mark.parametrize("kwargs", [{"tenant_id": {"$ne": ""}}, {"resource": {"$gt": ""}}, {"tenant_id": "a/b"}])
def test_given_operator_like_waiter_filters_then_typed_error_before_any_query(kwargs):
    with pytest.raises(InvalidLeaseRequest):
        operations.list_waiters(**kwargs)
    with pytest.raises(InvalidLeaseRequest):
        operations.globally_full([{"$ne": ""}])


def test_given_a_counter_key_then_holders_are_those_booking_it_and_a_bad_key_is_refused():
    a = hold(user="alice")
    hold(project="web", user="bob")
    page = operations.list_holders(tenant_id="acme", books="opres|project|acme/docs")
    assert [h.token for h in page.items] == [a.token]
    for bad in ({"$ne": ""}, "opres|project|acme", "opres|global|acme", "a|b", "opres|user|acme/$x"):
        with pytest.raises(InvalidLeaseRequest):
            operations.list_holders(tenant_id="acme", books=bad)


def test_given_a_revocation_then_its_audit_entry_is_found_by_id_in_its_tenant_only(handler):
    lease = hold()
    operations.revoke_holder(lease.token, tenant_id="acme", acting_user="ops", reason="stuck")
    (entry,) = operations.list_audit("acme")
    assert operations.get_audit(entry["id"], tenant_id="acme")["token"] == lease.token
    with pytest.raises(AuditEntryNotFound):
        operations.get_audit(entry["id"], tenant_id="globex")
    for bad in ({"$ne": ""}, "x" * 24, "abc"):
        with pytest.raises(InvalidLeaseRequest):
            operations.get_audit(bad)


def test_given_waiters_blocked_at_the_global_level_then_the_tenant_view_costs_one_find_and_a_clock_read(steady_tickets):
    config.put_document("_vance", "_tenant", document_path("wqlease"),
                        "resource: wqres\nlevels: {global: 1, user: 5}\nttlSeconds: 60\nwaitMs: 30000")
    held = [wq_hold("globex", "research", "g1")]
    waiters = [queue_up("acme", "docs", f"u{n}") for n in range(3)] + [queue_up("globex", "research", "g2")]
    try:
        with counted_commands() as counter:
            mine = operations.list_waiters(tenant_id="acme")
            # The waiters' own keep-alives run meanwhile (findAndModify); count the reads.
            reads = [c for c in counter.commands if c != "findAndModify"]
    finally:
        finish(held, waiters)
    # Tenants alternate: after two of acme's (ties go to the older), globex's g2 is third.
    assert [(w.user_id, w.position) for w in mine.items] == [("u0", 1), ("u1", 2), ("u2", 4)]
    # One find for the queues and MongoDB's clock; the global level's numbers are not even read.
    assert sorted(reads) == ["find", "hello"], reads
