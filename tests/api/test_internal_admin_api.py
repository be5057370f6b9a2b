"""Internal admin API (/internal/lease/admin/…): shared secret only, handlers dispatched."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.errors import LeaseLost
from leases.revocation import dispatch, handlers
from leases.store import client as store

SECRET = "test-internal-secret"


class RecordingHandler(handlers.LeaseHandler):
    type = "admtest"

    def __init__(self):
        self.revoked = []

    def on_revoked(self, holder):
        self.revoked.append(holder.token)


@pytest.fixture(autouse=True)
def handler(settings):
    assert settings.LEASES_INTERNAL_SECRET == SECRET
    h = handlers.register_handler(RecordingHandler())
    config.put_document("_vance", "_tenant", document_path("admlease"), "levels: {tenant: 5}\nttlSeconds: 60")
    yield h
    handlers.unregister_handler("admtest")


def hold(tenant="acme", pod=None):
    return leases.acquire(leases.LeaseRequest(type="admtest", lease="admlease", tenant_id=tenant,
                                              project_id="p", user_id="u", pod=pod))


def post(client, url, secret=None, body=None):
    headers = {} if secret is None else {"HTTP_X_LEASE_SECRET": secret}
    return client.post(url, data=json.dumps(body or {"actor": "cli:test"}), content_type="application/json", **headers)


@pytest.mark.parametrize("secret", [None, "", "wrong", SECRET + "x", SECRET[:-1], "tést"])
def test_given_no_or_wrong_secret_then_403_and_nothing_revoked(secret):
    lease = hold()
    for url in (f"/internal/lease/admin/revoke/{lease.token}", "/internal/lease/admin/revoke-pod/pod-a"):
        response = post(Client(), url, secret)
        assert response.status_code == 403
        assert response.json()["code"] == "FORBIDDEN"
    lease.check()


def test_given_a_tenant_ui_session_without_secret_then_403():
    lease = hold()
    admin = get_user_model().objects.create_superuser("root", "r@example.com", "pw-123456")
    client = Client()
    client.force_login(admin)
    assert post(client, f"/internal/lease/admin/revoke/{lease.token}").status_code == 403
    lease.check()


def test_given_the_secret_when_revoking_a_token_then_revoked_handler_ran_and_check_lost(handler):
    lease = hold(tenant="globex")  # any tenant: operators act across tenants
    # CSRF enforcement does not matter: machine-to-machine, authenticated by the secret.
    response = post(Client(enforce_csrf_checks=True), f"/internal/lease/admin/revoke/{lease.token}", SECRET,
                    {"actor": "cli:ops", "reason": "stuck"})

    assert response.status_code == 200
    data = response.json()
    assert [h["token"] for h in data["revoked"]] == [lease.token] and data["dispatchSettled"] is True
    assert handler.revoked == [lease.token]
    with pytest.raises(LeaseLost):
        lease.check()
    audit = store.audit().find_one({"token": lease.token})
    assert audit["actor"] == "internal-admin:cli:ops" and audit["tenantId"] == "globex" and audit["reason"] == "stuck"


def test_given_the_secret_when_revoking_a_pod_then_all_its_holders_go(handler):
    mine = [hold(pod="pod-a"), hold(tenant="globex", pod="pod-a")]
    other = hold(pod="pod-b")

    response = post(Client(), "/internal/lease/admin/revoke-pod/pod-a", SECRET)

    assert response.status_code == 200
    assert {h["token"] for h in response.json()["revoked"]} == {m.token for m in mine}
    assert dispatch.get_dispatcher().drain(timeout=10)
    assert sorted(handler.revoked) == sorted(m.token for m in mine)
    other.check()


@pytest.mark.parametrize("url,status,code", [
    ("/internal/lease/admin/revoke/" + "A" * 32, 404, "HOLDER_NOT_FOUND"),
    ("/internal/lease/admin/revoke/%24ne", 400, "INVALID_REQUEST"),
    ("/internal/lease/admin/revoke-pod/a%20b", 400, "INVALID_REQUEST"),
])
def test_given_unknown_or_malformed_ids_then_typed_errors(url, status, code):
    lease = hold()
    response = post(Client(), url, SECRET)
    assert response.status_code == status and response.json()["code"] == code
    lease.check()


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", json.dumps({"actor": {"$ne": 1}}).encode(),
                                  json.dumps({"actor": "x", "reason": "r" * 500}).encode()])
def test_given_a_bad_body_then_400_and_nothing_revoked(body):
    lease = hold()
    response = Client().post(f"/internal/lease/admin/revoke/{lease.token}", data=body,
                             content_type="application/json", HTTP_X_LEASE_SECRET=SECRET)
    assert response.status_code == 400
    lease.check()


def test_given_get_then_405():
    lease = hold()
    assert Client().get(f"/internal/lease/admin/revoke/{lease.token}", HTTP_X_LEASE_SECRET=SECRET).status_code == 405
    lease.check()


# --- the operator sweep ----------------------------------------------------------------------

def _dead_pod_holder(pod="gone-pod"):
    return hold(pod=pod)


@pytest.mark.parametrize("secret", [None, "", "wrong", SECRET + "x"])
def test_given_no_or_wrong_secret_when_sweeping_then_403_and_nothing_reaped(secret):
    lease = _dead_pod_holder()
    response = post(Client(), "/internal/lease/admin/sweep", secret)
    assert response.status_code == 403 and response.json()["code"] == "FORBIDDEN"
    lease.check()


@pytest.mark.parametrize("body", [b"not json", b"[1]", json.dumps({"actor": {"$ne": 1}}).encode()])
def test_given_a_bad_body_when_sweeping_then_400_and_nothing_reaped(body):
    lease = _dead_pod_holder()
    response = Client().post("/internal/lease/admin/sweep", data=body, content_type="application/json",
                             HTTP_X_LEASE_SECRET=SECRET)
    assert response.status_code == 400 and response.json()["code"] == "INVALID_REQUEST"
    lease.check()


def test_given_the_secret_when_sweeping_then_each_reaped_holder_comes_with_its_dispatch_outcome(handler):
    ran = hold(pod="gone-pod")
    store.holders().update_one({"_id": ran.token}, {"$set": {"podBound": False}})
    released = hold(tenant="globex", pod="gone-pod")
    store.holders().update_one({"_id": released.token}, {"$set": {"podBound": True}})
    orphan = hold(pod="gone-pod")
    store.holders().update_one({"_id": orphan.token}, {"$set": {"type": "nosuchtype"}})

    response = post(Client(enforce_csrf_checks=True), "/internal/lease/admin/sweep", SECRET)

    assert response.status_code == 200
    data = response.json()
    outcomes = {h["token"]: (h["outcome"], h["ranOn"], h["handlerRan"]) for h in data["holders"]}
    me = data["pod"]
    assert outcomes == {ran.token: ("local-payload", me, True), released.token: ("release-only", None, False),
                        orphan.token: ("no-handler", None, False)}
    assert data["unhandled"] == [orphan.token] and data["dispatchSettled"] is True and data["done"] == 3
    assert handler.revoked == [ran.token]


def test_given_get_when_sweeping_then_405():
    assert Client().get("/internal/lease/admin/sweep", HTTP_X_LEASE_SECRET=SECRET).status_code == 405


def test_given_a_pod_bound_holder_of_a_dead_pod_when_revoking_then_the_answer_says_release_only(handler):
    # The answer reports what the dispatcher did, not just that it was asked to.
    bound = hold(pod="gone-pod")
    store.holders().update_one({"_id": bound.token}, {"$set": {"podBound": True}})

    data = post(Client(), f"/internal/lease/admin/revoke/{bound.token}", SECRET).json()

    [row] = data["revoked"]
    assert (row["outcome"], row["ranOn"], row["handlerRan"]) == ("release-only", None, False)
    assert data["dispatchSettled"] is True and data["unhandled"] == [] and handler.revoked == []
