"""The fence where people and programs see a lease: the HTTP answers and their OpenAPI
schema, `lease show`, Insights' holder detail, and the guard's refusal metric."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from prometheus_client import generate_latest

import leases
from insights.models import Membership, Project, Tenant
from leases.api import keys
from leases.api.openapi import document
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.errors import StaleFence
from leases.fencing import FenceGuard
from leases.store import fence_codec
from leases.telemetry import metrics
from tests.helpers import ensure_tenant, quiet_handler_fixture

handler = quiet_handler_fixture("fenceview")


def call(api, method, path, body=None, *, key):
    return getattr(api, method)(f"/api/v1/{path}", data=json.dumps(body) if body is not None else "",
                                content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


@pytest.fixture
def key():
    ensure_tenant("acme", "p1")
    config.put_document("_vance", "_tenant", document_path("fenced"), "levels: {global: 1}\nwaitMs: 10000")
    return keys.create_key(tenant_id="acme", name="ci", acting_user="test")[1]


def test_given_an_http_grant_then_201_and_every_renewal_answer_the_fence_the_booking_recorded(key):
    api = Client()
    granted = call(api, "post", "leases", {"type": "tex", "projectId": "p1", "userId": "u1", "lease": "fenced"},
                   key=key)
    assert granted.status_code == 201
    fence = granted.json()["fence"]
    assert fence_codec.decode(fence).counter == "fenced|global|*"
    token = granted.json()["token"]
    assert call(api, "post", f"leases/{token}/renew", {}, key=key).json()["fence"] == fence
    assert call(api, "put", f"leases/{token}/payload", {"payload": {"a": 1}}, key=key).json()["fence"] == fence
    call(api, "delete", f"leases/{token}", key=key)


def test_given_a_ticket_granted_on_a_poll_then_its_201_carries_a_newer_fence_of_the_freed_slot(key, settings):
    settings.LEASES_HTTP_MAX_WAIT_MS = 200
    api = Client()
    body = {"type": "tex", "projectId": "p1", "lease": "fenced"}
    first = call(api, "post", "leases", {**body, "userId": "a"}, key=key).json()
    queued = call(api, "post", "leases", {**body, "userId": "b"}, key=key)
    assert queued.status_code == 202
    ticket = queued.json()["ticket"]
    call(api, "delete", f"leases/{first['token']}", key=key)
    polled = call(api, "get", f"tickets/{ticket}", key=key)
    assert polled.status_code == 201
    old, new = fence_codec.decode(first["fence"]), fence_codec.decode(polled.json()["fence"])
    assert new.slot == old.slot and new.generation > old.generation
    # Polling the granted ticket again answers the same grant, fence included.
    assert call(api, "get", f"tickets/{ticket}", key=key).json()["fence"] == polled.json()["fence"]
    call(api, "delete", f"leases/{ticket}", key=key)


def test_the_openapi_document_describes_the_fence_of_a_grant():
    grant = document()["components"]["schemas"]["Grant"]
    assert "fence" in grant["required"]
    assert grant["properties"]["fence"]["type"] == ["string", "null"]
    assert "STALE_FENCE" in grant["properties"]["fence"]["description"]


def test_lease_show_prints_the_fence_and_what_it_names():
    config.put_document("_vance", "_tenant", document_path("fenced"), "levels: {global: 3, user: 1}\nfence: user")
    lease = leases.acquire(leases.LeaseRequest(type="fenceview", lease="fenced", tenant_id="acme", project_id="p1",
                                               user_id="carol"))
    out = StringIO()
    call_command("lease", "show", "--", lease.token, stdout=out)
    line = next(x for x in out.getvalue().splitlines() if x.startswith("fence "))
    assert lease.fence in line and "slot 0, generation" in line and "fenced|user|acme/carol" in line
    out = StringIO()
    call_command("lease", "show", "--json", "--", lease.token, stdout=out)
    assert json.loads(out.getvalue())["fence"] == lease.fence
    lease.release()


def test_insights_holder_detail_shows_the_fence():
    config.put_document("_vance", "_tenant", document_path("fenced"), "levels: {global: 3}")
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    Project.objects.create(tenant=tenant, slug="docs")
    admin = get_user_model().objects.create_user("acme-admin", password="pw-123456")
    Membership.objects.create(user=admin, tenant=tenant, role=Membership.Role.ADMIN)
    lease = leases.acquire(leases.LeaseRequest(type="fenceview", lease="fenced", tenant_id="acme", project_id="docs",
                                               user_id="alice"))
    client = Client()
    client.force_login(admin)
    page = client.get(f"/t/acme/insights/leases/holders/{lease.token}").content.decode()
    assert lease.fence in page and f"generation {fence_codec.decode(lease.fence).generation}" in page
    lease.release()


def test_a_refusal_is_exported_as_vance_lease_fence_rejected_total_with_the_guards_resource(mongo_db):
    guard = FenceGuard(mongo_db["resource_fences"], resource="browser")
    guard.admit(fence_codec.encode("browser|user|acme/x", 0, int(time.time() * 1e6)))
    guard.admit(fence_codec.encode("browser|user|acme/x", 0, int(time.time() * 1e6) + 10))
    with pytest.raises(StaleFence):
        guard.admit(fence_codec.encode("browser|user|acme/x", 0, 1))
    exposition = generate_latest().decode()
    line = next(x for x in exposition.splitlines()
                if x.startswith(f'{metrics.PREFIX}fence_rejected_total{{resource="browser"}}'))
    assert float(line.split()[-1]) >= 1
    assert metrics.PREFIX == "vance_lease_"
