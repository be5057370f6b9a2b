"""Lease names no layer defines: NOOP by default, UNKNOWN_LEASE on request, and listed.

A misspelt ``lease="txe"`` is silently unlimited by the spec; ``LEASES_UNDEFINED_LEASE =
"error"`` makes it a typed error, and either way the name shows up (last hour) in
``manage.py lease undefined`` and on the tenant's Insights definition page.
"""

from __future__ import annotations

import asyncio
import json
from functools import partial
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

import leases
from insights.models import Membership, Tenant
from leases.definitions import invalidation, layers as config, undefined
from leases.definitions.model import document_path
from leases.errors import InvalidLeaseRequest, UnknownLease, by_code
from leases.revocation import handlers
from leases.store import client as store
from tests.helpers import counted_commands, lease_request


class _Handler(handlers.LeaseHandler):
    type = "test"

    def on_revoked(self, holder):
        pass


@pytest.fixture(autouse=True)
def handler():
    handlers.register_handler(_Handler())
    undefined.forget()
    yield
    handlers.unregister_handler("test")
    undefined.forget()


_req = partial(lease_request, project="docs", user="alice")


def _lease_cli(*args: str) -> str:
    out = StringIO()
    call_command("lease", *args, stdout=out)
    return out.getvalue()


def test_given_the_default_setting_when_acquiring_an_undefined_name_then_noop_and_the_name_is_listed():
    lease = leases.acquire(_req("txe"))
    assert lease is leases.NOOP
    [row] = undefined.recent()
    assert (row.name, row.tenant_id, row.project_id) == ("txe", "acme", "docs")
    assert store.holders().count_documents({}) == 0 and store.counters().count_documents({}) == 0


def test_given_error_mode_when_acquiring_an_undefined_name_then_unknown_lease_and_nothing_is_held(settings):
    settings.LEASES_UNDEFINED_LEASE = "error"
    with pytest.raises(UnknownLease) as caught:
        leases.acquire(_req("txe"))
    assert caught.value.code == "UNKNOWN_LEASE" and "txe" in str(caught.value)
    assert isinstance(caught.value, InvalidLeaseRequest) and by_code("UNKNOWN_LEASE") is UnknownLease
    assert leases.UnknownLease is UnknownLease
    assert store.holders().count_documents({}) == 0 and store.counters().count_documents({}) == 0
    assert [r.name for r in undefined.recent("acme")] == ["txe"]  # refused names are listed too
    # Defined names are untouched by the setting: a capped one is held, an uncapped one is NOOP.
    config.put_document("_vance", "_tenant", document_path("tex2"), "levels: {user: 1}\nttlSeconds: 30")
    config.put_document("_vance", "_tenant", document_path("free"), "ttlSeconds: 30")
    with leases.acquire(_req("tex2")) as held:
        assert not held.is_noop
    assert leases.acquire(_req("free")) is leases.NOOP


def test_given_a_bad_setting_value_then_an_undefined_name_is_refused_and_the_check_says_so(settings):
    from leases import checks

    settings.LEASES_UNDEFINED_LEASE = "Noop"
    with pytest.raises(UnknownLease):
        leases.acquire(_req("txe"))
    assert [e.id for e in checks.check_undefined_lease()] == ["leases.E020"]
    settings.LEASES_UNDEFINED_LEASE = "error"
    assert checks.check_undefined_lease() == []


def test_given_repeated_acquisitions_of_an_undefined_name_then_one_record_and_defined_noop_costs_nothing():
    config.put_document("_vance", "_tenant", document_path("free"), "ttlSeconds: 30")
    assert invalidation.wait_listening()
    leases.acquire(_req("free"))  # warm the definition cache
    leases.acquire(_req("txe"))
    with counted_commands() as counted:
        for _ in range(5):
            assert leases.acquire(_req("txe")) is leases.NOOP  # recorded a moment ago: no write
            assert leases.acquire(_req("free")) is leases.NOOP  # defined: never recorded
    assert counted.commands == []
    assert store.db()[undefined.COLLECTION].find_one()["records"] == 1


def test_given_a_name_defined_after_it_was_recorded_then_it_is_no_longer_listed():
    leases.acquire(_req("late"))
    assert [r.name for r in undefined.recent()] == ["late"]
    config.put_document("_vance", "_tenant", document_path("late"), "levels: {user: 2}\n")
    assert undefined.recent() == []


def test_given_names_of_two_tenants_then_the_cli_lists_them_and_filters_by_tenant():
    leases.acquire(_req("txe"))
    leases.acquire(_req("brwoser", tenant="globex", project="research"))
    text = _lease_cli("undefined")
    assert "txe" in text and "brwoser" in text and "2 undefined name(s) in the last hour" in text
    rows = json.loads(_lease_cli("undefined", "--tenant", "globex", "--json"))
    assert [(r["name"], r["tenantId"], r["projectId"]) for r in rows] == [("brwoser", "globex", "research")]
    assert "No undefined lease names" in _lease_cli("undefined", "--tenant", "initech")


def test_given_an_old_record_then_it_is_not_listed():
    leases.acquire(_req("txe"))
    store.db()[undefined.COLLECTION].update_one({}, [{"$set": {"lastAt": {"$subtract": ["$$NOW", 3_700_000]}}}])
    assert undefined.recent() == []


def test_given_a_tenant_admin_then_the_definition_page_lists_own_undefined_names_only():
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    admin = get_user_model().objects.create_user("ada", password="pw-123456")
    Membership.objects.create(user=admin, tenant=tenant, role=Membership.Role.ADMIN)
    leases.acquire(_req("txe"))
    leases.acquire(_req("brwoser", tenant="globex", project="research"))
    client = Client()
    client.force_login(admin)
    page = client.get("/t/acme/insights/leases/definition").content.decode()
    assert 'id="undefined-names"' in page and ">txe</span>" in page and "brwoser" not in page
    assert "ran as NOOP leases" in page


def test_given_error_mode_when_acquiring_an_undefined_name_async_then_the_same_unknown_lease(settings):
    settings.LEASES_UNDEFINED_LEASE = "error"
    async def acquire():
        return await leases.aacquire(_req("txe"))

    with pytest.raises(UnknownLease):
        asyncio.run(acquire())
    assert [r.name for r in undefined.recent("acme")] == ["txe"]
