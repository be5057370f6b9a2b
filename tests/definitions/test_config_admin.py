"""Config documents through the Django admin and the lease_config command."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from leases.definitions import invalidation, model as definitions
from leases.definitions.model import document_path
from leases.models import ConfigDocument
from leases.store import client as store


@pytest.fixture
def admin_client(client):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456")
    client.force_login(user)
    return client


def test_given_admin_edit_of_a_layer_then_cached_definitions_are_dropped(admin_client):
    assert invalidation.wait_listening()
    assert definitions.resolve("tex", "acme", "p1").levels["project"] == 1
    response = admin_client.post("/admin/leases/configdocument/add/", {
        "tenant_id": "acme", "project_id": "p1", "path": document_path("tex"), "text": "levels: {project: 3}"})
    assert response.status_code == 302, response.content[:500]
    assert ("acme", "p1", "tex") not in definitions.cache._entries
    assert definitions.resolve("tex", "acme", "p1").levels["project"] == 3
    doc = ConfigDocument.objects.get(tenant_id="acme", project_id="p1")
    admin_client.post(f"/admin/leases/configdocument/{doc.pk}/delete/", {"post": "yes"})
    assert definitions.resolve("tex", "acme", "p1").levels["project"] == 1


def test_given_a_broken_document_in_the_admin_then_it_is_refused_and_nothing_stored(admin_client):
    response = admin_client.post("/admin/leases/configdocument/add/", {
        "tenant_id": "acme", "project_id": "p1", "path": document_path("tex"), "text": "levels: {project: 0}"})
    assert response.status_code == 200 and b"INVALID_DEFINITION" in response.content
    assert store.config_documents().count_documents({}) == 0


def test_lease_config_command_put_show_list_delete(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("levels: {tenant: 2}\n"))
    call_command("lease_config", "put", "acme", "_tenant", "tex")
    assert definitions.load("tex", "acme", "p1").levels["tenant"] == 2
    out = io.StringIO()
    call_command("lease_config", "list", "--tenant", "acme", stdout=out)
    assert document_path("tex") in out.getvalue()
    call_command("lease_config", "delete", "acme", "_tenant", "tex")
    assert definitions.load("tex", "acme", "p1").levels["tenant"] == 3
    monkeypatch.setattr("sys.stdin", io.StringIO("levels: {tenant: nope}\n"))
    with pytest.raises(CommandError, match="INVALID_DEFINITION"):
        call_command("lease_config", "put", "acme", "_tenant", "tex")
    with pytest.raises(CommandError, match="INVALID_REQUEST"):
        call_command("lease_config", "delete", "$gt", "_tenant", "tex")
    assert store.config_documents().count_documents({}) == 0


def test_given_a_tenant_admin_raising_its_own_share_in_the_admin_then_it_is_ignored_and_said(admin_client):
    # Given: the tenant layer sets shares.tenants (System-owned) and shares.projects (its own).
    text = "levels: {project: 2}\nshares: {tenants: {acme: 10}, projects: {p1: 2}}"
    response = admin_client.post("/admin/leases/configdocument/add/", {
        "tenant_id": "acme", "project_id": "_tenant", "path": document_path("tex"), "text": text}, follow=True)
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    assert any("ignored, not applied: shares.tenants" in m and "tenant layer" in m for m in shown), shown
    definition = definitions.load("tex", "acme", "p1")
    assert definition.tenant_weight("acme") == 1  # never applied
    assert definition.project_weight("p1") == 2


def test_given_lease_config_put_with_a_field_the_layer_may_not_own_then_it_warns_and_does_not_apply(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("priorities: [interactive, batch]\nshares: {tenants: {acme: 5}}\n"
                                                 "levels: {user: 1}\n"))
    out = io.StringIO()
    call_command("lease_config", "put", "acme", "p1", "tex", stdout=out)
    printed = out.getvalue()
    assert "ignored, not applied: priorities, shares.tenants" in printed, printed
    assert "project layer" in printed
    definition = definitions.load("tex", "acme", "p1")
    assert definition.priorities == () and definition.tenant_shares == {} and definition.levels["user"] == 1
    out = io.StringIO()
    monkeypatch.setattr("sys.stdin", io.StringIO("levels: {global: 4}\nshares: {tenants: {acme: 5}}\n"))
    call_command("lease_config", "put", "_vance", "_tenant", "tex", stdout=out)
    assert "ignored" not in out.getvalue()
    assert definitions.load("tex", "acme", "p1").tenant_weight("acme") == 5
