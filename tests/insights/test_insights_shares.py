"""Insights → Shares: every member of a tenant sees its own weight, classes and project
weights (never another tenant's); only its admins set the project weights (CSRF-checked,
audited, applied); the waiting view shows each ticket's class and expected grant."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

import leases
from insights.models import Membership, Project, Tenant
from leases.definitions import layers as config, model as definitions
from leases.definitions.model import document_path
from leases.store import client as store
from tests.helpers import queue_up, quiet_handler_fixture

SYSTEM = ("resource: shres\nlevels: {global: 1}\nwaitMs: 30000\npriorities: [interactive, batch]\n"
          "allowedPriorities: {globex: [batch]}\nmaxStarvationMs: 2000\nshares: {tenants: {acme: 3, globex: 7}}\n")


handler = quiet_handler_fixture("uitest")


@pytest.fixture
def users():
    config.put_document("_vance", "_tenant", document_path("shlease"), SYSTEM)
    out = {}
    for slug, projects in (("acme", ("docs", "web")), ("globex", ("research",))):
        tenant = Tenant.objects.create(slug=slug, name=slug.title())
        for project in projects:
            Project.objects.create(tenant=tenant, slug=project)
        for role in ("admin", "member"):
            user = get_user_model().objects.create_user(f"{slug}-{role}", password="pw-123456")
            Membership.objects.create(user=user, tenant=tenant,
                                      role=Membership.Role.ADMIN if role == "admin" else Membership.Role.MEMBER)
            out[f"{slug}-{role}"] = user
    return out


def logged_in(user, **kwargs):
    client = Client(**kwargs)
    client.force_login(user)
    return client


URL = "/t/acme/insights/leases/shares"


def test_given_the_tenant_admin_then_it_sees_its_own_weight_and_classes_only(users):
    page = logged_in(users["acme-admin"]).get(URL, {"name": "shlease"}).content.decode()
    assert re.search(r'class="tenant-weight"><strong>3</strong>', page), page
    assert "interactive" in page and "batch" in page and "2000 ms" in page
    assert "globex" not in page and ">7<" not in page
    other = logged_in(users["globex-admin"]).get("/t/globex/insights/leases/shares", {"name": "shlease"}).content.decode()
    assert re.search(r'class="tenant-weight"><strong>7</strong>', other)
    classes = re.search(r'class="classes">(.*?)</td>', other, re.S).group(1)
    assert "batch" in classes and "interactive" not in classes  # the operator restricted globex
    assert "acme" not in other


def test_given_the_tenant_admin_when_setting_a_project_weight_then_it_is_applied_and_audited(users):
    client = logged_in(users["acme-admin"])
    response = client.post(URL, {"name": "shlease", "project": "web", "weight": "2"})
    assert response.status_code == 302
    assert definitions.load("shlease", "acme", "web").project_weight("web") == 2
    assert definitions.load("shlease", "acme", "docs").project_weight("docs") == 1
    record = store.audit().find_one({"action": "project-weight", "tenantId": "acme"})
    assert record["actor"] == "acme-admin" and record["key"] == "web" and record["after"] == 2
    page = client.get(URL, {"name": "shlease"}).content.decode()
    assert re.search(r'<tr data-project="web"><td>web</td><td class="num">2</td>', page), page
    # The tenant's own weight did not move: a project weight never changes the tenant's share.
    assert definitions.load("shlease", "acme", "web").tenant_weight("acme") == 3
    assert client.post(URL, {"name": "shlease", "project": "web", "weight": ""}).status_code == 302
    assert definitions.load("shlease", "acme", "web").project_weight("web") == 1


@pytest.mark.parametrize("post", [
    {"name": "shlease", "project": "research", "weight": "2"},   # another tenant's project
    {"name": "shlease", "project": "web", "weight": "-1"},
    {"name": "shlease", "project": "web", "weight": "lots"},
    {"name": "$bad", "project": "web", "weight": "2"},
])
def test_given_bad_input_then_the_form_refuses_and_nothing_is_written(users, post):
    response = logged_in(users["acme-admin"]).post(URL, post)
    assert response.status_code == 400
    assert store.config_documents().count_documents({"tenantId": "acme"}) == 0
    assert store.audit().count_documents({"action": "project-weight"}) == 0


def test_given_a_plain_member_then_it_sees_the_weight_classes_and_project_weights_without_the_form(users):
    config.put_document("acme", "_tenant", document_path("shlease"), "shares: {projects: {web: 2}}")

    response = logged_in(users["acme-member"]).get(URL, {"name": "shlease"})

    page = response.content.decode()
    assert response.status_code == 200
    assert re.search(r'class="tenant-weight"><strong>3</strong>', page), page
    classes = re.search(r'class="classes">(.*?)</td>', page, re.S).group(1)
    assert "interactive" in classes and "batch" in classes and "2000 ms" in page
    assert re.search(r'<tr data-project="web"><td>web</td><td class="num">2</td>', page), page
    assert re.search(r'<tr data-project="docs"><td>docs</td><td class="num">1 <span', page), page
    assert '<form method="post" action="" class="filters">' not in page  # the weight form
    assert "Set weight" not in page and 'name="weight"' not in page
    assert "set by your tenant's admins" in page
    assert "globex" not in page and ">7<" not in page
    # No tab leads the member to an admin-only page (those answer 403).
    assert "/t/acme/insights/leases/shares" in page
    for admin_only in ("/t/acme/insights/leases/counters", "/t/acme/insights/leases/waiting",
                       "/t/acme/insights/leases/history", "/t/acme/insights/api-keys"):
        assert f'href="{admin_only}' not in page, admin_only
    # The admin, on the same page, gets the form and every tab.
    admin_page = logged_in(users["acme-admin"]).get(URL, {"name": "shlease"}).content.decode()
    assert '<form method="post" action="" class="filters">' in admin_page and 'name="weight"' in admin_page
    assert 'href="/t/acme/insights/leases/counters' in admin_page and 'href="/t/acme/insights/api-keys' in admin_page


def test_given_a_plain_member_when_posting_a_project_weight_then_refused_and_nothing_is_written(users):
    response = logged_in(users["acme-member"]).post(URL, {"name": "shlease", "project": "web", "weight": "9"})

    assert response.status_code == 403
    assert store.config_documents().count_documents({"tenantId": "acme"}) == 0
    assert store.audit().count_documents({"action": "project-weight"}) == 0
    assert definitions.load("shlease", "acme", "web").project_weight("web") == 1


def test_given_another_tenants_member_or_admin_or_no_login_or_no_csrf_then_refused(users):
    # Another tenant's people are told the tenant does not exist for them (the access policy).
    assert logged_in(users["globex-member"]).get(URL, {"name": "shlease"}).status_code == 404
    assert logged_in(users["globex-admin"]).post(URL, {"name": "shlease", "project": "web",
                                                       "weight": "9"}).status_code == 404
    anonymous = Client().get(URL, {"name": "shlease"})
    assert anonymous.status_code == 302 and "login" in anonymous["Location"]
    assert logged_in(users["acme-member"]).get("/t/$ne/insights/leases/shares").status_code == 404
    strict = logged_in(users["acme-admin"], enforce_csrf_checks=True)
    assert strict.post(URL, {"name": "shlease", "project": "web", "weight": "9"}).status_code == 403
    assert store.config_documents().count_documents({"tenantId": "acme"}) == 0


def test_given_waiting_tickets_then_the_waiting_view_shows_their_class_and_expected_grant(users):
    first = leases.acquire(leases.LeaseRequest(type="uitest", lease="shlease", tenant_id="acme", project_id="docs",
                                               user_id="h0", pod=""))
    first.release()  # one hold on record: estimates can be made
    held = leases.acquire(leases.LeaseRequest(type="uitest", lease="shlease", tenant_id="globex",
                                              project_id="research", user_id="h", pod=""))
    waiter = queue_up(leases.LeaseRequest(type="uitest", lease="shlease", tenant_id="acme", project_id="docs",
                                          user_id="alice", pod="", priority="interactive"), "shres|global|*")
    try:
        page = logged_in(users["acme-admin"]).get("/t/acme/insights/leases/waiting").content.decode()
        row = re.search(r'<tr data-ticket="[^"]+">(.*?)</tr>', page, re.S).group(1)
        assert '<td class="class">interactive</td>' in row
        estimate = re.search(r'class="small estimate"[^>]*>([^<]*)<', row).group(1)
        assert estimate == "now" or estimate.startswith("in "), row
    finally:
        held.release()
        waiter.join(30)
        if waiter.lease is not None:
            waiter.lease.release()
