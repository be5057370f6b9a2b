"""The tenancy hook (LEASES_TENANT_ACCESS): Insights and API keys ask it, and only it.

``GroupTenantAccess`` below is the example of a host's own tenant model (docs/how-to/tenancy.md): Django's
``auth.Group`` stands in for it (a group named like the tenant id; staff are its admins).
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

import leases
from leases.api import keys
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.errors import UnknownProject, UnknownTenant
from leases.revocation import handlers
from leases.tenancy import ADMIN, MEMBER, TenantAccess, TenantGrant, tenant_access

HOOK = "tests.test_tenancy.GroupTenantAccess"


class GroupTenantAccess(TenantAccess):
    """A host's tenants are its auth groups; staff members of a group are its admins."""

    def grant(self, user, tenant_id):
        group = user.groups.filter(name=tenant_id).first()
        if group is None:
            return None
        return TenantGrant(slug=group.name, name=f"Team {group.name}", role=ADMIN if user.is_staff else MEMBER)

    def grants(self, user):
        return [TenantGrant(slug=g.name, name=f"Team {g.name}", role=ADMIN if user.is_staff else MEMBER)
                for g in user.groups.order_by("name")]

    def projects(self, tenant_id):
        return ["main"] if Group.objects.filter(name=tenant_id).exists() else []

    def tenant_exists(self, tenant_id):
        return Group.objects.filter(name=tenant_id).exists()


class WrongTenantAccess(GroupTenantAccess):
    """A broken hook that answers for another tenant than the one asked."""

    def grant(self, user, tenant_id):
        return TenantGrant(slug="red", name="Red", role=ADMIN)


class NotAHook:
    pass


class NullHandler(handlers.LeaseHandler):
    type = "tenancytest"

    def on_revoked(self, holder):
        pass


@pytest.fixture
def teams():
    handlers.register_handler(NullHandler())
    config.put_document("_vance", "_tenant", document_path("tlease"),
                        "resource: tres\nlevels: {global: 10, tenant: 5, user: 2}\nttlSeconds: 120")
    users = {}
    for team in ("red", "blue"):
        Group.objects.create(name=team)
    for name, team, staff in (("rita", "red", True), ("ron", "red", False), ("bert", "blue", True)):
        user = get_user_model().objects.create_user(name, password="pw-123456", is_staff=staff)
        user.groups.add(Group.objects.get(name=team))
        users[name] = user
    held = {team: leases.acquire(leases.LeaseRequest(type="tenancytest", lease="tlease", tenant_id=team,
                                                     project_id="main", user_id=f"u-{team}", pod=""))
            for team in ("red", "blue")}
    yield users, held
    for lease in held.values():
        lease.release()
    handlers.unregister_handler("tenancytest")


def _client(user):
    client = Client()
    client.force_login(user)
    return client


@override_settings(LEASES_TENANT_ACCESS=HOOK)
def test_given_a_host_hook_when_its_admin_opens_insights_then_the_own_tenants_holders_show_and_no_other(teams):
    users, held = teams
    page = _client(users["rita"]).get("/t/red/insights/leases")
    assert page.status_code == 200
    body = page.content.decode()
    assert held["red"].token in body and held["blue"].token not in body
    assert "Team red" in body


@override_settings(LEASES_TENANT_ACCESS=HOOK)
def test_given_a_host_hook_then_a_member_gets_403_and_a_stranger_404_like_a_missing_tenant(teams):
    users, _ = teams
    assert _client(users["ron"]).get("/t/red/insights/leases").status_code == 403
    assert _client(users["bert"]).get("/t/red/insights/leases").status_code == 404
    assert _client(users["bert"]).get("/t/nosuch/insights/leases").status_code == 404


@override_settings(LEASES_TENANT_ACCESS=HOOK)
def test_given_a_host_hook_then_the_start_page_lists_the_hooks_tenants(teams):
    users, _ = teams
    body = _client(users["rita"]).get("/").content.decode()
    assert "Team red" in body and "Team blue" not in body


@override_settings(LEASES_TENANT_ACCESS=HOOK)
def test_given_a_host_hook_when_creating_api_keys_then_the_hook_decides_which_tenants_and_projects_exist(teams):
    users, _ = teams
    key, plaintext = keys.create_key(tenant_id="red", project_id="main", name="ci", acting_user=users["rita"])
    assert keys.authenticate(plaintext).prefix == key.prefix
    with pytest.raises(UnknownTenant):
        keys.create_key(tenant_id="green", name="ci", acting_user=users["rita"])
    with pytest.raises(UnknownProject):
        keys.create_key(tenant_id="red", project_id="docs", name="ci", acting_user=users["rita"])
    page = _client(users["rita"]).get("/t/red/insights/api-keys")
    assert page.status_code == 200 and key.prefix in page.content.decode()


@override_settings(LEASES_TENANT_ACCESS="tests.test_tenancy.WrongTenantAccess")
def test_given_a_hook_that_grants_another_tenant_than_asked_then_404_not_that_tenants_page(teams):
    users, held = teams
    page = _client(users["bert"]).get("/t/blue/insights/leases")
    assert page.status_code == 404
    assert held["red"].token not in page.content.decode()


@pytest.mark.parametrize("path", ["tests.test_tenancy.NoSuchClass", "no_such_module.Access", "tests.test_tenancy.NotAHook"])
def test_given_a_bad_hook_path_when_asked_then_improperly_configured_names_it(path):
    with override_settings(LEASES_TENANT_ACCESS=path), pytest.raises(ImproperlyConfigured, match="LEASES_TENANT_ACCESS"):
        tenant_access()
