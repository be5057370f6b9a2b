"""HTTP lease protocol (/api/v1/) in-process through Django's test client on the real store.

The server-issued lease scenarios over HTTP: duplicate, delayed and replayed renewals never move the
deadline backwards; stale and expired answers leave state untouched; release twice;
acquire after expiry; clamped proposals; busy answers name the right level. Auth (no key,
wrong key, other tenant's key, revoked key) and bad bodies (400, nothing written).
"""

from __future__ import annotations

import datetime as dt
import json
import time

import pymongo
import pytest
from django.test import Client, RequestFactory

from insights.models import Project, Tenant
from leases import service
from leases.api import bodies, keys, problems, protocol
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.ops import actions
from leases.store import client as store
from tests.helpers import ensure_tenant

TYPE = "tex"  # registered by leases.contrib in every process


@pytest.fixture
def api():
    return Client(enforce_csrf_checks=True)  # proves the API needs no CSRF token


@pytest.fixture(autouse=True)
def scopes():
    ensure_tenant("acme", "p1")
    ensure_tenant("globex")


@pytest.fixture
def key():
    return keys.create_key(tenant_id="acme", name="ci", acting_user="test")[1]


@pytest.fixture
def other_key():
    return keys.create_key(tenant_id="globex", name="ci", acting_user="test")[1]


def call(api, method, path, body=None, *, key=None, raw=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    data = raw if raw is not None else (json.dumps(body) if body is not None else "")
    return getattr(api, method)(f"/api/v1/{path}", data=data, content_type="application/json", **headers)


def inline(name="x", ttl=30, **levels):
    return {"name": name, "levels": levels or {"user": 1}, "ttlSeconds": ttl}


def acquire(api, key, *, project="p1", user="u1", **extra):
    body = {"type": TYPE, "projectId": project, "userId": user, **extra}
    if "lease" not in extra and "inline" not in extra:
        body["inline"] = inline()
    return call(api, "post", "leases", body, key=key)


def holder(token):
    return store.holders().find_one({"_id": token})


def state_snapshot():
    """Everything a refused or terminal answer must leave untouched."""
    # A counter's clock and repair stamps are bookkeeping of reads, not bookings.
    return (sorted(map(str, store.holders().find({}))),
            sorted(map(str, store.counters().find({}, {"updatedAt": 0, "clock": 0, "checkedAt": 0}))),
            sorted(map(str, store.tombstones().find({}))))


def assert_problem(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == code and body["status"] == status and body["detail"]
    return body


# --- acquire -------------------------------------------------------------------------------

def test_given_a_key_when_acquiring_then_201_carries_token_interval_and_the_holders_server_deadline(api, key):
    response = acquire(api, key, holderRef="agent-7", podBound=True)
    assert response.status_code == 201
    grant = response.json()
    doc = holder(grant["token"])
    assert doc["tenantId"] == "acme" and doc["projectId"] == "p1" and doc["userId"] == "u1"
    # HTTP holders are detached: no pod, so only the idle reap applies to them.
    assert doc["pod"] == "" and doc["podBound"] is True and doc["holderRef"] == "agent-7"
    assert grant["ttlSeconds"] == 30 and grant["intervalSeconds"] == 10
    assert grant["expiryDeadline"] == protocol.iso(doc["expiresAt"])
    assert grant["expiryDeadlineMs"] == protocol.epoch_ms(doc["expiresAt"])
    assert grant["serverTime"] == protocol.iso(doc["lastSeenAt"])
    assert grant["resource"] == "mcp-inline:acme/p1/x" and grant["noop"] is False


@pytest.mark.parametrize("ttl,proposed,issued", [
    (30, None, 10),   # no proposal: ttl/3
    (30, 1, 3),       # below ttl/10 → raised to the floor
    (30, 7, 7),       # inside the bounds → kept
    (30, 3600, 15),   # above ttl/2 → lowered to the ceiling
    (1, 5, 1),        # tiny TTL: both bounds are 1 s
])
def test_given_a_proposed_interval_when_acquiring_then_the_server_clamps_it_into_ttl_bounds(api, key, ttl, proposed, issued):
    extra = {"inline": inline(ttl=ttl)}
    if proposed is not None:
        extra["proposedIntervalSeconds"] = proposed
    response = acquire(api, key, **extra)
    assert response.status_code == 201 and response.json()["intervalSeconds"] == issued
    assert protocol.interval_bounds(ttl)[0] <= issued <= protocol.interval_bounds(ttl)[1]


def test_given_an_issued_interval_when_renewing_then_it_stays_until_a_renewal_proposes_another(api, key):
    grant = acquire(api, key, proposedIntervalSeconds=4).json()
    assert grant["intervalSeconds"] == 4

    def renew(body):
        return call(api, "post", f"leases/{grant['token']}/renew", body, key=key).json()["intervalSeconds"]

    assert renew({}) == 4                                  # no proposal: the issued interval stands
    assert renew({"proposedIntervalSeconds": 12}) == 12    # re-negotiated inside [3, 15]
    assert renew({"proposedIntervalSeconds": 1}) == 3      # clamped to ttl/10
    assert renew({"proposedIntervalSeconds": 99}) == 15    # clamped to ttl/2
    assert renew({}) == 15 and holder(grant["token"])["intervalSeconds"] == 15


def test_given_a_lease_without_caps_when_acquiring_then_200_noop_and_nothing_written(api, key):
    response = acquire(api, key, lease="undefined-lease")
    assert response.status_code == 200 and response.json() == {
        "noop": True, "token": None, "type": TYPE, "leaseName": "undefined-lease"}
    assert store.holders().count_documents({}) == 0


@pytest.mark.parametrize("user", ["alice.smith", "bob@example.com", "c+d", "e" * 150])
def test_given_an_email_or_django_username_as_user_id_when_acquiring_then_201(api, key, user):
    response = acquire(api, key, user=user)
    assert response.status_code == 201, response.content
    assert store.holders().find_one({"_id": response.json()["token"]})["userId"] == user


@pytest.mark.parametrize("levels", [{"user": 1}, {}])
def test_given_an_inline_definition_with_a_priority_class_then_400_whether_or_not_it_has_caps(api, key, levels):
    """Inline definitions name no classes; the document says inline + priority is no valid request."""
    response = acquire(api, key, inline={"name": "x", "levels": levels}, priority="high")
    assert_problem(response, 400, "INVALID_REQUEST")
    assert store.holders().count_documents({}) == 0 and store.counters().count_documents({}) == 0


def test_given_undefined_leases_refused_when_acquiring_an_undefined_name_then_400_unknown_lease(api, key, settings):
    settings.LEASES_UNDEFINED_LEASE = "error"
    assert_problem(acquire(api, key, lease="undefined-lease"), 400, "UNKNOWN_LEASE")
    assert store.holders().count_documents({}) == 0


def test_given_a_full_user_level_when_acquiring_then_429_with_retry_after_and_the_user_diagnosis(api, key):
    assert acquire(api, key).status_code == 201
    before = state_snapshot()
    response = acquire(api, key, inline=inline(user=1, project=5), waitMs=0)
    body = assert_problem(response, 429, "LEASE_BUSY")
    assert int(response["Retry-After"]) >= 1 and body["retryAfterSeconds"] == int(response["Retry-After"])
    assert {k: body[k] for k in ("resource", "level", "scope", "count", "cap")} == {
        "resource": "mcp-inline:acme/p1/x", "level": "user", "scope": "acme/u1", "count": 1, "cap": 1}
    assert state_snapshot() == before


def test_given_a_full_tenant_level_when_acquiring_then_the_busy_answer_names_the_tenant_level(api, key):
    config.put_document("acme", "_tenant", document_path("shared"), "levels: {tenant: 1, user: 5}\nttlSeconds: 30")
    assert acquire(api, key, lease="shared").status_code == 201
    body = assert_problem(acquire(api, key, lease="shared", project="p2", user="u2", waitMs=0), 429, "LEASE_BUSY")
    assert (body["resource"], body["level"], body["scope"], body["count"], body["cap"]) == ("shared", "tenant", "acme", 1, 1)


def test_given_a_long_definition_wait_when_acquiring_then_the_wait_is_bounded_by_the_http_setting(api, key, settings,
                                                                                                 monkeypatch):
    settings.LEASES_HTTP_MAX_WAIT_MS = 300
    assert acquire(api, key, inline={**inline(), "waitMs": 60000}).status_code == 201
    asked = []
    real_acquire, real_or_ticket = service.acquire, service.acquire_or_ticket

    def recording_acquire(request):
        asked.append(request.wait_ms)
        return real_acquire(request)

    def recording_or_ticket(request, **kwargs):
        asked.append(request.wait_ms)
        return real_or_ticket(request, **kwargs)

    # Either entry (a waiting acquire may answer with a ticket) must be asked for the HTTP bound.
    monkeypatch.setattr(service, "acquire", recording_acquire)
    monkeypatch.setattr(service, "acquire_or_ticket", recording_or_ticket)
    started = time.monotonic()
    response = acquire(api, key, inline={**inline(), "waitMs": 60000})
    assert_problem(response, 429, "LEASE_BUSY")
    # the engine was asked to wait the HTTP bound, not the definition's minute
    assert asked == [300]
    # and the answer came long before that minute, however loaded the machine
    assert time.monotonic() - started < 30


def test_given_an_unreachable_store_when_acquiring_then_503_lease_unavailable(api, key):
    dead = pymongo.MongoClient("mongodb://127.0.0.1:9/?directConnection=true", serverSelectionTimeoutMS=300,
                               connectTimeoutMS=300, timeoutMS=300)
    store.set_client(dead)
    try:
        response = acquire(api, key)
    finally:
        store.set_client(None)
        dead.close()
    assert_problem(response, 503, "LEASE_UNAVAILABLE")
    assert store.holders().count_documents({}) == 0


def test_given_an_unregistered_type_when_acquiring_then_400_unknown_lease_type(api, key):
    assert_problem(call(api, "post", "leases", {"type": "nope", "projectId": "p1", "userId": "u1",
                                                  "inline": inline()}, key=key), 400, "UNKNOWN_LEASE_TYPE")
    assert store.holders().count_documents({}) == 0


# --- renew ---------------------------------------------------------------------------------

def test_given_a_held_lease_when_renewing_repeatedly_then_the_deadline_never_moves_backwards(api, key):
    grant = acquire(api, key).json()
    deadlines = [grant["expiryDeadlineMs"]]
    for _ in range(3):  # duplicates in quick succession, possibly within one millisecond
        response = call(api, "post", f"leases/{grant['token']}/renew", {}, key=key)
        assert response.status_code == 200
        deadlines.append(response.json()["expiryDeadlineMs"])
    assert deadlines == sorted(deadlines)
    assert protocol.epoch_ms(holder(grant["token"])["expiresAt"]) == deadlines[-1]


def test_given_a_later_deadline_when_a_delayed_renewal_arrives_then_it_keeps_the_later_deadline(api, key):
    grant = acquire(api, key).json()
    # A renewal issued under a longer TTL left a later deadline; a delayed or replayed
    # renewal computed from the shorter TTL must not pull it back.
    later = holder(grant["token"])["expiresAt"] + dt.timedelta(minutes=10)
    store.holders().update_one({"_id": grant["token"]}, {"$set": {"expiresAt": later}})
    response = call(api, "post", f"leases/{grant['token']}/renew", key=key)  # empty body is fine
    assert response.status_code == 200
    assert response.json()["expiryDeadline"] == protocol.iso(later)
    assert holder(grant["token"])["expiresAt"] == later


def test_given_an_unknown_token_when_renewing_then_410_stale_and_nothing_is_written(api, key):
    acquire(api, key)
    before = state_snapshot()
    body = assert_problem(call(api, "post", "leases/" + "A" * 32 + "/renew", {}, key=key), 410, "STALE_LEASE")
    assert "reason" not in body
    assert state_snapshot() == before


def test_given_another_tenants_token_when_renewing_updating_or_releasing_then_it_answers_as_unknown(api, key, other_key):
    token = acquire(api, key).json()["token"]
    before = state_snapshot()
    assert_problem(call(api, "post", f"leases/{token}/renew", {}, key=other_key), 410, "STALE_LEASE")
    assert_problem(call(api, "put", f"leases/{token}/payload", {"payload": {"a": 1}}, key=other_key), 410, "STALE_LEASE")
    assert_problem(call(api, "delete", f"leases/{token}", key=other_key), 410, "STALE_LEASE")
    assert state_snapshot() == before
    # ...and the answers are byte-for-byte those of a token that never existed.
    never = call(api, "post", "leases/" + "B" * 32 + "/renew", {}, key=other_key).json()
    mine = call(api, "post", f"leases/{token}/renew", {}, key=other_key).json()
    assert {k: v for k, v in never.items() if k != "detail"} == {k: v for k, v in mine.items() if k != "detail"}


def test_given_a_lease_past_its_deadline_when_renewing_then_410_expired_it_is_reaped_not_revived_and_a_fresh_acquire_works(api, key):
    grant = acquire(api, key, inline=inline(ttl=1)).json()
    deadline = holder(grant["token"])["expiresAt"]
    while store.server_now() <= deadline:  # the server's clock decides, not ours
        time.sleep(0.1)
    body = assert_problem(call(api, "post", f"leases/{grant['token']}/renew", {}, key=key), 410, "EXPIRED")
    # The renewal that came too late ends the holder at once (as the sweep would have):
    # no revival, the slot is back, and the tombstone says why.
    assert body["reason"] == "idle"
    assert holder(grant["token"]) is None
    assert store.tombstones().find_one({"_id": grant["token"]})["reason"] == "idle"
    from leases.revocation import dispatch
    assert dispatch.get_dispatcher().drain(10)  # its handler's claim is written on the tombstone
    before = state_snapshot()
    again = assert_problem(call(api, "put", f"leases/{grant['token']}/payload", {"payload": {"a": 1}}, key=key),
                           410, "EXPIRED")
    assert again["reason"] == "idle"
    assert state_snapshot() == before  # an ended token is terminal: nothing is touched
    fresh = acquire(api, key, inline=inline(ttl=1))  # cap 1: only possible because the slot came back
    assert fresh.status_code == 201 and fresh.json()["token"] != grant["token"]


def test_given_a_revoked_lease_when_renewing_then_410_expired_with_reason_revoke(api, key):
    token = acquire(api, key).json()["token"]
    actions.revoke_holder(token, tenant_id="acme", acting_user="ops", dispatch=False)
    before = state_snapshot()
    body = assert_problem(call(api, "post", f"leases/{token}/renew", {}, key=key), 410, "EXPIRED")
    assert body["reason"] == "revoke"
    assert state_snapshot() == before


def test_given_a_lease_when_updating_its_payload_then_it_is_stored_literally_and_renewed(api, key):
    grant = acquire(api, key).json()
    response = call(api, "put", f"leases/{grant['token']}/payload",
                    {"payload": {"endpoint": "$not-an-operator", "session": {"id": "s-1"}}}, key=key)
    assert response.status_code == 200
    doc = holder(grant["token"])
    assert doc["payload"] == {"endpoint": "$not-an-operator", "session": {"id": "s-1"}}
    assert response.json()["expiryDeadlineMs"] >= grant["expiryDeadlineMs"]


# --- release -------------------------------------------------------------------------------

def test_given_a_lease_when_releasing_twice_then_both_answer_200_telling_which(api, key):
    token = acquire(api, key).json()["token"]
    first = call(api, "delete", f"leases/{token}", key=key)
    assert first.status_code == 200 and first.json() == {
        "token": token, "released": True, "alreadyReleased": False, "reason": "release"}
    assert store.holders().count_documents({}) == 0
    assert [c["count"] for c in store.counters().find({})] == [0]
    second = call(api, "delete", f"leases/{token}", key=key)
    assert second.status_code == 200 and second.json() == {
        "token": token, "released": False, "alreadyReleased": True, "reason": "release"}
    assert [c["count"] for c in store.counters().find({})] == [0]
    # A released token is terminal for renewals too.
    assert assert_problem(call(api, "post", f"leases/{token}/renew", {}, key=key), 410, "EXPIRED")["reason"] == "release"


def test_given_an_unknown_token_when_releasing_then_410_stale(api, key):
    assert_problem(call(api, "delete", "leases/" + "C" * 32, key=key), 410, "STALE_LEASE")


# --- authentication and project binding ------------------------------------------------------

@pytest.mark.parametrize("header", [None, "Bearer", "Basic dXNlcjpwdw==", "Bearer not-a-key",
                                    "Bearer vlk_aaaaaaaaaaaa_" + "x" * 43])
def test_given_no_or_a_wrong_key_when_calling_then_401_and_nothing_written(api, header):
    headers = {"HTTP_AUTHORIZATION": header} if header else {}
    response = api.post("/api/v1/leases", data=json.dumps({"type": TYPE, "projectId": "p1", "userId": "u1",
                                                             "inline": inline()}),
                        content_type="application/json", **headers)
    assert_problem(response, 401, "UNAUTHENTICATED")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert store.holders().count_documents({}) == 0


def test_given_a_right_prefix_with_a_wrong_secret_when_calling_then_401(api, key):
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert_problem(acquire(api, wrong), 401, "UNAUTHENTICATED")


def test_given_a_revoked_key_when_calling_then_401_even_for_its_own_leases(api, key):
    token = acquire(api, key).json()["token"]
    prefix = keys.KEY_RE.fullmatch(key).group(1)
    keys.revoke_key(tenant_id="acme", prefix=prefix, acting_user="test")
    assert_problem(call(api, "post", f"leases/{token}/renew", {}, key=key), 401, "UNAUTHENTICATED")
    assert_problem(acquire(api, key), 401, "UNAUTHENTICATED")
    assert store.holders().count_documents({}) == 1


def test_given_a_key_whose_tenant_was_deleted_when_acquiring_then_401_and_nothing_written(api, key):
    # Given a key of acme and a named lease with a global cap every tenant shares
    config.put_document("_vance", "_tenant", document_path("tex2pdf"), "levels: {global: 2}\n")
    token = acquire(api, key, lease="tex2pdf").json()["token"]
    before = state_snapshot()
    # When acme is deleted, then the key books nothing any more (no invisible counters)
    Tenant.objects.filter(slug="acme").delete()
    body = assert_problem(acquire(api, key, lease="tex2pdf"), 401, "API_KEY_SCOPE_GONE")
    assert "acme" in body["detail"]
    assert_problem(call(api, "post", f"leases/{token}/renew", {}, key=key), 401, "API_KEY_SCOPE_GONE")
    assert state_snapshot() == before


def test_given_a_project_bound_key_whose_project_was_deleted_when_acquiring_then_401(api):
    bound = keys.create_key(tenant_id="acme", project_id="p1", name="p1 only", acting_user="test")[1]
    Project.objects.filter(slug="p1").delete()
    assert_problem(acquire(api, bound), 401, "API_KEY_SCOPE_GONE")
    assert store.holders().count_documents({}) == 0 and store.counters().count_documents({}) == 0


@pytest.mark.parametrize("project", ["_tenant", "_vance"])
def test_given_a_reserved_layer_id_as_project_when_acquiring_then_400_and_nothing_written(api, key, project):
    # Given a tenant document with a cap: it must count once, as the tenant layer
    config.put_document("acme", "_tenant", document_path("tex2pdf"), "levels: {tenant: 5, project: 1}\n")
    body = assert_problem(acquire(api, key, project=project, lease="tex2pdf"), 400, "INVALID_REQUEST")
    assert "reserved" in body["detail"]
    assert store.holders().count_documents({}) == 0 and store.counters().count_documents({}) == 0


def test_given_a_project_bound_key_when_acting_then_it_is_limited_to_its_project(api, key):
    bound = keys.create_key(tenant_id="acme", project_id="p1", name="p1 only", acting_user="test")[1]
    assert_problem(acquire(api, bound, project="p2"), 403, "PROJECT_FORBIDDEN")
    own = acquire(api, bound, user="u9")
    assert own.status_code == 201 and holder(own.json()["token"])["projectId"] == "p1"
    assert_problem(call(api, "post", "leases", {"type": TYPE, "userId": "u9", "inline": inline()}, key=bound),
                   400, "INVALID_BODY")  # projectId is always required, also for bound keys
    other_project = acquire(api, key, project="p2", user="u2").json()["token"]  # tenant-wide key
    assert_problem(call(api, "post", f"leases/{other_project}/renew", {}, key=bound), 410, "STALE_LEASE")
    assert_problem(call(api, "delete", f"leases/{other_project}", key=bound), 410, "STALE_LEASE")
    assert holder(other_project) is not None


# --- bad bodies ----------------------------------------------------------------------------

BASE = {"type": TYPE, "projectId": "p1", "userId": "u1", "inline": {"name": "x", "levels": {"user": 1}}}


@pytest.mark.parametrize("raw,code", [
    (json.dumps({**BASE, "userId": 5}), "INVALID_BODY"),
    (json.dumps({**BASE, "podBound": "yes"}), "INVALID_BODY"),
    (json.dumps({**BASE, "proposedIntervalSeconds": True}), "INVALID_BODY"),
    (json.dumps({**BASE, "proposedIntervalSeconds": 0}), "INVALID_BODY"),
    (json.dumps({**BASE, "waitMs": -1}), "INVALID_BODY"),
    (json.dumps({**BASE, "tenantId": "globex"}), "INVALID_BODY"),   # unknown field: the key decides
    (json.dumps({**BASE, "projectId": {"$ne": None}}), "INVALID_BODY"),
    (json.dumps({**BASE, "projectId": "$ne"}), "INVALID_REQUEST"),
    (json.dumps({**BASE, "userId": "a b"}), "INVALID_REQUEST"),
    (json.dumps({**BASE, "userId": "u" * 151}), "INVALID_REQUEST"),
    (json.dumps({**BASE, "inline": {"name": "x", "levels": {"global": 1}}}), "INVALID_DEFINITION"),
    (json.dumps({k: v for k, v in BASE.items() if k != "userId"}), "INVALID_BODY"),
    (json.dumps({**BASE, "inline": {"name": "x", "levels": {"user": None}}}), "INVALID_BODY"),
    (json.dumps({**BASE, "inline": {"name": "x", "levels": {"user": 1}, "ttlSeconds": None}}), "INVALID_BODY"),
    (json.dumps({**BASE, "inline": {"name": "x", "levels": {"user": 1.5}}}), "INVALID_DEFINITION"),
    ('{"type": "tex", "type": "tex", "projectId": "p1", "userId": "u1"}', "INVALID_BODY"),
    ('{"type": "tex", "projectId": "p1", "userId": "u1", "waitMs": NaN}', "INVALID_BODY"),
    ("[1, 2]", "INVALID_BODY"),
    ("{not json", "INVALID_BODY"),
    ("", "INVALID_BODY"),
    ("x" * (bodies.MAX_BODY_BYTES + 1), "BODY_TOO_LARGE"),
])
def test_given_a_bad_acquire_body_when_posting_then_400_problem_and_nothing_written(api, key, raw, code):
    assert_problem(call(api, "post", "leases", raw=raw, key=key), 400, code)
    assert store.holders().count_documents({}) == 0 and store.counters().count_documents({}) == 0


@pytest.mark.parametrize("payload_body,code", [
    ({"payload": {"$set": {"state": "x"}}}, "INVALID_REQUEST"),
    ({"payload": {"a": {"$where": "1"}}}, "INVALID_REQUEST"),
    ({"payload": {"dotted.key": 1}}, "INVALID_REQUEST"),
    ({"payload": {"blob": "x" * (17 * 1024)}}, "INVALID_REQUEST"),     # over the 16 KiB payload limit
    ({"payload": {"blob": "x" * (40 * 1024)}}, "BODY_TOO_LARGE"),      # over the 32 KiB body limit
    ({"payload": "not an object"}, "INVALID_BODY"),
    ({"payload": {}, "extra": 1}, "INVALID_BODY"),
    ({}, "INVALID_BODY"),
])
def test_given_a_bad_payload_when_updating_then_400_and_the_holder_is_unchanged(api, key, payload_body, code):
    token = acquire(api, key).json()["token"]
    call(api, "put", f"leases/{token}/payload", {"payload": {"kept": True}}, key=key)
    before = state_snapshot()
    assert_problem(call(api, "put", f"leases/{token}/payload", payload_body, key=key), 400, code)
    assert state_snapshot() == before and holder(token)["payload"] == {"kept": True}


@pytest.mark.parametrize("token", ["short", "x" * 65, "has.dot" + "x" * 20, "%24ne" + "x" * 20])
def test_given_a_malformed_token_when_renewing_then_400_before_any_query(api, key, token):
    assert_problem(call(api, "post", f"leases/{token}/renew", {}, key=key), 400, "INVALID_REQUEST")


def test_given_a_bad_renew_body_when_renewing_then_400_and_the_deadline_is_unchanged(api, key):
    token = acquire(api, key).json()["token"]
    before = state_snapshot()
    assert_problem(call(api, "post", f"leases/{token}/renew", {"ttlSeconds": 9999}, key=key), 400, "INVALID_BODY")
    assert state_snapshot() == before


def test_given_a_wrong_method_when_calling_then_405_problem_with_allow(api, key):
    response = call(api, "get", "leases", key=key)
    assert_problem(response, 405, "METHOD_NOT_ALLOWED")
    assert response["Allow"] == "POST"


def test_given_the_openapi_route_when_fetched_without_a_key_then_it_lists_every_operation(api):
    doc = api.get("/api/v1/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    operations_ = {op["operationId"] for item in doc["paths"].values() for op in item.values() if isinstance(op, dict) and "operationId" in op}
    assert operations_ == {"acquireLease", "renewLease", "updateLeasePayload", "releaseLease", "openapiDocument",
                           "pollTicket", "abandonTicket"}


def test_given_an_empty_host_header_when_calling_the_api_then_400_problem_json_and_nothing_changes(api, key):
    # Refused before any view runs (Django's DisallowedHost): the API's clients still get
    # problem+json, never Django's HTML page (schemathesis found an empty Host header).
    token = acquire(api, key).json()["token"]
    before = state_snapshot()
    response = api.put(f"/api/v1/leases/{token}/payload", data=json.dumps({"payload": {"a": 1}}),
                       content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_HOST="")
    assert_problem(response, 400, "INVALID_REQUEST")
    assert state_snapshot() == before
    # The same request with its Host is the view's: the payload is stored.
    assert call(api, "put", f"leases/{token}/payload", {"payload": {"a": 1}}, key=key).status_code == 200


def test_given_a_request_refused_off_the_api_then_the_handler_answers_djangos_own_400_page():
    for path in ("/t/acme/insights/leases", "/nowhere"):
        response = problems.bad_request(RequestFactory().get(path))
        assert response.status_code == 400 and response["Content-Type"].startswith("text/html"), path


# --- command budget ------------------------------------------------------------------------

def test_given_a_warm_four_level_lease_when_using_it_over_http_then_each_call_costs_the_engines_commands(api, key):
    from leases.definitions import invalidation
    from tests.helpers import counted_commands

    config.put_document("acme", "_tenant", document_path("four"), "levels: {global: 9, tenant: 9, project: 9, user: 9}")
    assert invalidation.wait_listening()
    warm = acquire(api, key, lease="four").json()["token"]  # counters exist, cache warm
    call(api, "delete", f"leases/{warm}", key=key)
    spent = {}
    with counted_commands() as counted:
        def cost(name, response, status):
            assert response.status_code == status, response.content
            spent[name] = list(counted.commands)
            counted.commands.clear()
            return response

        token = cost("acquire", acquire(api, key, lease="four"), 201).json()["token"]
        cost("renew", call(api, "post", f"leases/{token}/renew", {}, key=key), 200)
        cost("payload", call(api, "put", f"leases/{token}/payload", {"payload": {"a": 1}}, key=key), 200)
        cost("release", call(api, "delete", f"leases/{token}", key=key), 200)
        cost("ended", call(api, "post", f"leases/{token}/renew", {}, key=key), 410)
    # The grant answers from the HELD update itself: holder, one bulk for every level, HELD.
    assert spent["acquire"] == ["findAndModify", "update", "findAndModify"]
    # A renewal decides on the deadline it replaced (returned by the same command): no
    # clock read first.
    assert spent["renew"] == spent["payload"] == ["findAndModify"]
    # Delete, the narrower levels, the gate (its queue is handed the slot), the tombstone.
    assert spent["release"] == ["findAndModify", "update", "findAndModify", "update"]
    # An ended token: the renewal matches nothing, the tombstone says why.
    assert spent["ended"] == ["findAndModify", "find"]
