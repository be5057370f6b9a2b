"""leases.ops.actions: operator revocations of one holder or a whole pod, audited, handlers dispatched."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from leases.errors import HolderNotFound, InvalidLeaseRequest, LeaseLost
from leases.ops import actions
from leases.revocation import dispatch, listener
from leases.store import client as store
from tests.helpers import hold, operator_leases


@pytest.fixture(autouse=True)
def handler():
    with operator_leases() as recording:
        yield recording


def reaps(reason):
    return REGISTRY.get_sample_value("vance_lease_reap_total", {"reason": reason}) or 0.0



def test_given_a_holder_when_revoked_then_reaped_counters_returned_audited_handler_run_and_check_lost(handler):
    lease = hold(user="alice", ref="job-1")
    other = hold(user="bob")
    before = reaps("revoke")

    revoked = actions.revoke_holder(lease.token, tenant_id="acme", acting_user="ops-alice", reason="stuck")

    assert revoked.token == lease.token and revoked.reason == "revoke"
    assert store.holders().find_one({"_id": lease.token}) is None
    assert store.counters().find_one({"_id": "opres|user|acme/alice"})["count"] == 0
    assert store.counters().find_one({"_id": "opres|tenant|acme"})["count"] == 1
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "revoke"
    assert reaps("revoke") == before + 1
    entry = store.audit().find_one({"token": lease.token})
    assert entry["actor"] == "ops-alice" and entry["tenantId"] == "acme" and entry["action"] == "revoke"
    assert entry["reason"] == "stuck" and entry["at"] is not None and entry["handlerDispatched"] is True
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
        actions.revoke_holder(theirs.token, tenant_id="acme", acting_user="acme-admin")

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
        actions.revoke_holder(lease.token, **kwargs)
    lease.check()
    assert store.audit().count_documents({}) == 0 and store.tombstones().count_documents({}) == 0


def test_given_force_when_revoking_without_dispatch_then_no_handler_runs(handler):
    lease = hold()

    actions.revoke_holder(lease.token, acting_user="cli --force", dispatch=False)

    assert dispatch.get_dispatcher().drain(timeout=10)
    assert handler.revoked == []
    assert store.audit().find_one({"token": lease.token})["handlerDispatched"] is False
    with pytest.raises(LeaseLost):
        lease.check()


def test_given_holders_on_a_pod_when_revoking_the_pod_then_all_of_its_holders_go_across_tenants(handler):
    on_pod = [hold(user="alice", pod="pod-x"), hold(tenant="globex", project="research", user="dave", pod="pod-x")]
    elsewhere = hold(user="bob", pod="pod-y")

    revoked = actions.revoke_pod("pod-x", acting_user="ops")

    assert {h.token for h in revoked} == {lease.token for lease in on_pod}
    assert store.holders().count_documents({"pod": "pod-x"}) == 0
    elsewhere.check()
    assert store.audit().count_documents({"action": "revoke-pod"}) == 2
    with pytest.raises(InvalidLeaseRequest):
        actions.revoke_pod({"$ne": ""}, acting_user="ops")
    with pytest.raises(InvalidLeaseRequest):
        actions.revoke_pod("", acting_user="ops")


def test_given_a_lease_granted_a_moment_ago_when_revoked_then_it_is_revoked_as_a_lease(handler, settings):
    # Given: a one-slot lease handed over by a release to a waiter; its holder is not marked
    # HELD yet (its mark is due later), and the waiter's process already has the lease.
    import leases
    from leases.errors import LeaseExpired
    from tests import helpers

    settings.LEASES_GRANT_MARK_DELAY_MS = 250
    helpers.define("opone", "resource: opone\nlevels: {global: 1}\nwaitMs: 10000\nttlSeconds: 60")
    req = lambda user: helpers.lease_request("opone", lease_type="optest", tenant="acme", user=user)  # noqa: E731
    held = leases.acquire(req("h"))
    waiter = helpers.queue_up(req("w"), "opone|global|*")
    held.release()
    waiter.join(10)
    lease = waiter.lease
    assert lease is not None and store.holders().find_one({"_id": lease.token})["state"] == "PENDING"
    # When: an operator revokes it.
    revoked = actions.revoke_holder(lease.token, tenant_id="acme", acting_user="ops", reason="stuck")
    # Then: it was revoked as the lease it is — not "no holder" — with its tombstone, its
    # handler run and its slot back; the lease is told why at its next call.
    assert revoked.token == lease.token
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "revoke"
    assert dispatch.get_dispatcher().drain(timeout=10)
    assert [h.token for h in handler.revoked] == [lease.token]
    assert store.counters().find_one({"_id": "opone|global|*"})["count"] == 0
    with pytest.raises(LeaseExpired) as lost:
        lease.check()
    assert lost.value.reason == "revoke"
    assert lease.release() is False
