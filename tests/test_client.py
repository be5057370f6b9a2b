"""leases.client.HttpLeaseClient against a real gunicorn process on the test database."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

import leases
from leases import LeaseBusy, LeaseLost, LeaseUnavailable
from leases.api import keys
from leases.client import ApiKeyRejected, HttpLease, HttpLeaseClient
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.errors import InvalidBody, LeaseExpired, StaleLease
from leases.ops import actions
from leases.store import client as store
from leases.store.embedded import free_port
from tests.helpers import ensure_tenant
from tests.http_server import running_server

TYPE = "tex"


@pytest.fixture(scope="module")
def server(django_db_setup):
    # A short server-side wait and ticket poll keep the waits through tickets short.
    with running_server(workers=2, threads=2, env={"LEASES_HTTP_MAX_WAIT_MS": "300",
                                                   "LEASES_TICKET_POLL_SECONDS": "1"}) as base_url:
        yield base_url


@pytest.fixture
def client(server):
    ensure_tenant("acme")
    key = keys.create_key(tenant_id="acme", name="client tests", acting_user="test")[1]
    with HttpLeaseClient(server, key, timeout=10) as http:
        yield http


def inline(ttl=30, **levels):
    return {"name": "c", "levels": levels or {"user": 1}, "ttlSeconds": ttl}


def take(client, **extra):
    return client.acquire(type=TYPE, project_id="p1", user_id="u1", inline=extra.pop("inline", inline()), **extra)


def test_given_a_lease_when_using_it_then_it_has_the_engine_lease_interface(client):
    with take(client, holder_ref="ci-1") as lease:
        assert isinstance(lease, HttpLease) and lease.is_noop is False
        assert lease.ttl_seconds == 30 and lease.interval_seconds == 10 and lease.resource == "mcp-inline:acme/p1/c"
        doc = store.holders().find_one({"_id": lease.token})
        assert doc["tenantId"] == "acme" and doc["pod"] == "" and doc["holderRef"] == "ci-1"
        assert lease.expiry_deadline.replace(tzinfo=None) == doc["expiresAt"]
        assert lease.fence is not None and lease.fence == doc["fence"]  # for the resource's guard
        lease.update_payload({"jobId": "j-42"})
        assert store.holders().find_one({"_id": lease.token})["payload"] == {"jobId": "j-42"}
        token = lease.token
    # The context manager released it: slots back, and a second release says so.
    assert store.holders().find_one({"_id": token}) is None
    assert lease.release() is False
    with pytest.raises(LeaseLost):
        lease.check()


def test_given_a_fresh_lease_when_checking_within_the_interval_then_no_request_is_sent(client):
    lease = take(client)
    seen = store.holders().find_one({"_id": lease.token})["lastSeenAt"]
    for _ in range(5):
        lease.check()  # the server-issued interval (10 s) has not passed: answered locally
    assert store.holders().find_one({"_id": lease.token})["lastSeenAt"] == seen
    lease.renew()  # an explicit renewal always goes to the server
    assert store.holders().find_one({"_id": lease.token})["lastSeenAt"] > seen
    assert lease.release() is True


def test_given_the_interval_has_passed_when_checking_then_check_renews_and_moves_the_deadline(client):
    lease = take(client, inline=inline(ttl=2))  # interval bounds for ttl 2: [1, 1]
    assert lease.interval_seconds == 1
    first = lease.expiry_deadline
    time.sleep(1.1)
    lease.check()
    assert lease.expiry_deadline > first
    assert lease.expiry_deadline.replace(tzinfo=None) == store.holders().find_one({"_id": lease.token})["expiresAt"]
    lease.release()


def test_given_a_full_level_when_acquiring_then_lease_busy_carries_the_diagnosis(client):
    held = take(client)
    with pytest.raises(LeaseBusy) as busy:
        take(client, wait_ms=0)
    error = busy.value
    assert (error.resource, error.level, error.scope, error.count, error.cap) == ("mcp-inline:acme/p1/c", "user", "acme/u1", 1, 1)
    assert error.retry_after == 1.0  # the server's Retry-After, a real attribute of LeaseBusy
    held.release()


def test_given_a_refused_body_when_acquiring_then_the_servers_error_class_is_raised(client):
    with pytest.raises(InvalidBody) as refused:
        take(client, interval_seconds=0)  # proposedIntervalSeconds must be positive
    assert refused.value.code == "INVALID_BODY" and type(refused.value) is InvalidBody
    assert store.holders().count_documents({}) == 0


def test_given_retry_busy_for_when_the_slot_frees_then_acquire_succeeds(client):
    held = take(client)
    releaser = threading.Timer(1.2, held.release)
    releaser.start()
    try:
        started = time.monotonic()
        lease = take(client, wait_ms=0, retry_busy_for=8)
        assert time.monotonic() - started >= 1.0
        assert lease.token != held.token
        lease.release()
    finally:
        releaser.cancel()


def test_given_a_revoked_lease_when_renewing_then_lease_expired_and_later_checks_fail_without_requests(client):
    lease = take(client)
    actions.revoke_holder(lease.token, tenant_id="acme", acting_user="ops", dispatch=False)
    with pytest.raises(LeaseExpired) as lost:
        lease.renew()
    assert isinstance(lost.value, LeaseLost) and lost.value.reason == "revoke" and lost.value.code == "EXPIRED"
    with pytest.raises(LeaseExpired):
        lease.check()
    assert lease.release() is False  # already ended: the server says alreadyReleased


def test_given_another_tenants_key_when_renewing_a_token_then_stale_lease(client, server):
    lease = take(client)
    ensure_tenant("globex")
    other = keys.create_key(tenant_id="globex", name="other", acting_user="test")[1]
    with HttpLeaseClient(server, other) as foreign:
        borrowed = HttpLease(foreign, {"token": lease.token, "ttlSeconds": 30, "intervalSeconds": 10})
        with pytest.raises(StaleLease):
            borrowed.renew()
    assert store.holders().find_one({"_id": lease.token}) is not None
    lease.release()


def test_given_no_renewal_when_the_ttl_passes_then_the_lease_expires(client):
    lease = take(client, inline=inline(ttl=1))
    deadline = store.holders().find_one({"_id": lease.token})["expiresAt"]
    while store.server_now() <= deadline:
        time.sleep(0.1)
    with pytest.raises(LeaseExpired) as lost:
        lease.renew()
    assert lost.value.reason == "idle"  # the late renewal reaped it: the slot is back at once
    assert store.holders().find_one({"_id": lease.token}) is None


def test_given_keepalive_when_longer_than_the_ttl_passes_then_the_lease_stays_held(client):
    lease = take(client, inline=inline(ttl=2))
    first_deadline = store.holders().find_one({"_id": lease.token})["expiresAt"]
    with lease.keepalive() as keeper:
        # Wait (bounded) until the server's clock has passed the deadline the lease was
        # acquired with and the keeper has renewed at least twice, however slow the machine.
        give_up = time.monotonic() + 30
        while (keeper.renewals < 2 or store.server_now() <= first_deadline) and time.monotonic() < give_up:
            time.sleep(0.1)
        assert keeper.renewals >= 2 and keeper.error is None
        assert store.server_now() > first_deadline
        doc = store.holders().find_one({"_id": lease.token})
        assert doc is not None and doc["expiresAt"] > store.server_now()
    assert lease.release() is True
    assert not keeper.running


def test_given_keepalive_when_the_lease_is_revoked_then_it_stops_and_check_raises(client):
    lease = take(client, inline=inline(ttl=2))
    keeper = lease.keepalive()
    actions.revoke_holder(lease.token, tenant_id="acme", acting_user="ops", dispatch=False)
    give_up = time.monotonic() + 5
    while keeper.running and time.monotonic() < give_up:
        time.sleep(0.1)
    assert not keeper.running and isinstance(keeper.error, LeaseExpired)
    with pytest.raises(LeaseLost):
        lease.check()


def test_given_an_unlimited_lease_when_acquiring_then_the_noop_lease_is_returned(client):
    lease = client.acquire(type=TYPE, lease="nothing-configured", project_id="p1", user_id="u1")
    assert lease is leases.NOOP and lease.is_noop
    assert store.holders().count_documents({}) == 0


def test_given_a_wrong_key_when_acquiring_then_api_key_rejected(server):
    with HttpLeaseClient(server, "vlk_aaaaaaaaaaaa_" + "x" * 43) as stranger:
        with pytest.raises(ApiKeyRejected) as rejected:
            take(stranger)
    assert rejected.value.status == 401 and rejected.value.code == "UNAUTHENTICATED"
    assert rejected.value.problem_code == "UNAUTHENTICATED"


def test_given_no_server_when_acquiring_then_lease_unavailable_fail_closed():
    with HttpLeaseClient(f"http://127.0.0.1:{free_port()}", "vlk_aaaaaaaaaaaa_" + "x" * 43, timeout=2) as nowhere:
        with pytest.raises(LeaseUnavailable):
            take(nowhere)


@pytest.fixture
def one_slot():
    """A named lease of one global slot (named per test: the server caches definitions)."""
    name = f"one-{uuid.uuid4().hex[:8]}"
    config.put_document("_vance", "_tenant", document_path(name), "levels: {global: 1}\nttlSeconds: 30\nwaitMs: 60000\n")
    return name


def kept_ticket():
    """The pending holder of a ticket the server answered 202 for, or None while the request
    still waits inside the server (only the 202 path stores the proposed interval on it)."""
    return store.holders().find_one({"state": "PENDING", "intervalSeconds": {"$exists": True}})


def until(condition, what, bound=30.0):
    give_up = time.monotonic() + bound
    while not (value := condition()):
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def test_given_a_busy_lease_when_acquiring_then_the_client_waits_through_the_ticket_and_gets_the_lease(client, one_slot):
    # Given the only slot held
    held = client.acquire(type=TYPE, lease=one_slot, project_id="p1", user_id="u1")
    outcome: dict = {}

    def wait_for_it():
        try:
            outcome["lease"] = client.acquire(type=TYPE, lease=one_slot, project_id="p1", user_id="u2",
                                              wait_ms=20000, interval_seconds=4)
        except Exception as error:  # reported by the assertions below
            outcome["error"] = error

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    try:
        # When the server answered 202 (the ticket is kept for polling) and then the slot frees
        ticket = until(kept_ticket, "the server to hand out a ticket")
        assert held.release() is True
        waiter.join(30)
    finally:
        waiter.join(30)
    # Then the client got the lease through the ticket: same object as a direct grant
    assert "error" not in outcome, outcome
    lease = outcome["lease"]
    assert isinstance(lease, HttpLease) and lease.token == ticket["_id"] and lease.resource == one_slot
    assert lease.interval_seconds == 4 and lease.ttl_seconds == 30
    doc = store.holders().find_one({"_id": lease.token})
    assert doc["state"] == "HELD" and doc["userId"] == "u2"
    assert lease.expiry_deadline.replace(tzinfo=None) == doc["expiresAt"]
    lease.renew()
    assert lease.release() is True
    assert store.holders().count_documents({}) == 0


def test_given_a_lease_that_stays_busy_when_the_clients_wait_bound_passes_then_busy_with_its_place_and_no_ticket_left(
        client, one_slot):
    held = client.acquire(type=TYPE, lease=one_slot, project_id="p1", user_id="u1")
    with pytest.raises(LeaseBusy) as busy:
        client.acquire(type=TYPE, lease=one_slot, project_id="p1", user_id="u2", wait_ms=1500)
    error = busy.value
    assert error.position == 1 and error.resource == one_slot and error.level == "global"
    # The client gave its place up: no ticket, no pending holder, the abandonment remembered
    assert store.holders().count_documents({"state": "PENDING"}) == 0
    assert store.counters().count_documents({"queue.0": {"$exists": True}}) == 0
    assert store.tombstones().find_one({"reason": "abandoned"}) is not None
    assert held.release() is True
