"""API keys: the service (hashed, shown once, audited), the tenant-admin pages, manage.py apikey."""

from __future__ import annotations

import hashlib
import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from insights.models import Membership, Project, Tenant
from leases.api import keys
from leases.api.models import ApiKey
from leases.errors import (
    ApiKeyNotFound,
    ApiKeyScopeGone,
    InvalidLeaseRequest,
    Unauthenticated,
    UnknownProject,
    UnknownTenant,
)
from leases.store import client as store


@pytest.fixture(autouse=True)
def scopes():
    """The tenants (and project) the keys below name: a key must name an existing scope."""
    acme = Tenant.objects.create(slug="acme", name="Acme")
    Project.objects.create(tenant=acme, slug="docs", name="Docs")
    Tenant.objects.create(slug="globex", name="Globex")
    return acme


def prefix_of(plaintext):
    return keys.KEY_RE.fullmatch(plaintext).group(1)


# --- service -------------------------------------------------------------------------------

def test_given_a_new_key_when_created_then_only_its_hash_is_stored_and_it_authenticates(mongo_db):
    key, plaintext = keys.create_key(tenant_id="acme", project_id="docs", name="mcp prod", acting_user="alice")
    assert keys.KEY_RE.fullmatch(plaintext)
    stored = mongo_db["api_keys"].find_one({"prefix": key.prefix})
    assert stored["secretHash"] == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext not in repr(stored) and plaintext.split("_", 2)[2] not in repr(stored)
    assert (stored["tenantId"], stored["projectId"], stored["createdBy"]) == ("acme", "docs", "alice")
    assert keys.authenticate(plaintext).pk == key.pk
    audit = store.audit().find_one({"action": "apikey-create"})
    assert (audit["tenantId"], audit["keyPrefix"], audit["actor"]) == ("acme", key.prefix, "alice") and audit["at"]


def test_given_another_tenant_when_revoking_a_key_then_it_is_not_found_and_stays_active():
    key, plaintext = keys.create_key(tenant_id="acme", name="k", acting_user="alice")
    with pytest.raises(ApiKeyNotFound):
        keys.revoke_key(tenant_id="globex", prefix=key.prefix, acting_user="mallory")
    assert keys.authenticate(plaintext).pk == key.pk
    revoked = keys.revoke_key(tenant_id="acme", prefix=key.prefix, acting_user="alice")
    assert revoked.revoked_at is not None and revoked.revoked_by == "alice"
    with pytest.raises(Unauthenticated):
        keys.authenticate(plaintext)
    again = keys.revoke_key(tenant_id="acme", prefix=key.prefix, acting_user="bob")  # idempotent
    assert again.revoked_at == revoked.revoked_at and again.revoked_by == "alice"
    assert store.audit().count_documents({"action": "apikey-revoke"}) == 1


@pytest.mark.parametrize("kwargs", [
    dict(tenant_id="$ne", name="k", acting_user="a"),
    dict(tenant_id="acme", project_id="a/b", name="k", acting_user="a"),
    dict(tenant_id="acme", name="", acting_user="a"),
    dict(tenant_id="acme", name="two\nlines", acting_user="a"),
    dict(tenant_id="acme", name="k", acting_user=None),
])
def test_given_bad_input_when_creating_a_key_then_a_typed_error_and_nothing_written(kwargs):
    with pytest.raises(InvalidLeaseRequest):
        keys.create_key(**kwargs)
    assert ApiKey.objects.count() == 0 and store.audit().count_documents({}) == 0


@pytest.mark.parametrize("bearer", ["", None, "vlk_short", "vlk_AAAAAAAAAAAA_" + "x" * 43, {"$ne": ""}])
def test_given_a_malformed_bearer_when_authenticating_then_unauthenticated(bearer):
    keys.create_key(tenant_id="acme", name="k", acting_user="a")
    with pytest.raises(Unauthenticated):
        keys.authenticate(bearer)


# --- pages ---------------------------------------------------------------------------------

@pytest.fixture
def tenant(scopes):
    return scopes


def user_with(tenant, role, name):
    user = get_user_model().objects.create_user(name, password="pw-" + name)
    if role is not None:
        Membership.objects.create(user=user, tenant=tenant, role=role)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    return browser


def csrf_post(browser, url, data):
    page = browser.get("/t/acme/insights/api-keys")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    return browser.post(url, {**data, "csrfmiddlewaretoken": token})


def test_given_a_tenant_admin_when_creating_a_key_then_the_plaintext_is_shown_exactly_once(tenant):
    admin = user_with(tenant, Membership.Role.ADMIN, "ada")
    response = csrf_post(admin, "/t/acme/insights/api-keys", {"name": "agent", "project": "docs"})
    assert response.status_code == 201 and response["Cache-Control"] == "no-store"
    plaintext = re.search(r'id="plaintext">(vlk_[^<]+)<', response.content.decode()).group(1)
    key = keys.authenticate(plaintext)
    assert (key.tenant_id, key.project_id, key.created_by) == ("acme", "docs", "ada")
    listing = admin.get("/t/acme/insights/api-keys").content.decode()
    assert key.prefix in listing and plaintext not in listing


def test_given_a_tenant_admin_when_revoking_a_key_then_it_answers_401_from_then_on(tenant):
    admin = user_with(tenant, Membership.Role.ADMIN, "ada")
    key, plaintext = keys.create_key(tenant_id="acme", name="old", acting_user="ada")
    response = csrf_post(admin, f"/t/acme/insights/api-keys/{key.prefix}/revoke", {})
    assert response.status_code == 302
    with pytest.raises(Unauthenticated):
        keys.authenticate(plaintext)
    assert "revoked" in admin.get("/t/acme/insights/api-keys").content.decode()


def test_given_another_tenants_key_when_an_admin_revokes_it_then_404_and_it_stays_active(tenant):
    admin = user_with(tenant, Membership.Role.ADMIN, "ada")
    foreign, plaintext = keys.create_key(tenant_id="globex", name="theirs", acting_user="gus")
    assert csrf_post(admin, f"/t/acme/insights/api-keys/{foreign.prefix}/revoke", {}).status_code == 404
    assert keys.authenticate(plaintext).pk == foreign.pk


def test_given_a_post_without_csrf_token_when_creating_then_403_and_no_key(tenant):
    admin = user_with(tenant, Membership.Role.ADMIN, "ada")
    assert admin.post("/t/acme/insights/api-keys", {"name": "x"}).status_code == 403
    assert ApiKey.objects.count() == 0


def test_given_non_admins_when_opening_the_page_then_login_403_or_404(tenant):
    assert Client().get("/t/acme/insights/api-keys").status_code == 302  # anonymous → login
    assert user_with(tenant, Membership.Role.MEMBER, "max").get("/t/acme/insights/api-keys").status_code == 403
    assert user_with(tenant, None, "sam").get("/t/acme/insights/api-keys").status_code == 404


def test_given_an_invalid_form_when_creating_then_400_and_nothing_written(tenant):
    admin = user_with(tenant, Membership.Role.ADMIN, "ada")
    assert csrf_post(admin, "/t/acme/insights/api-keys", {"name": "x", "project": "not-ours"}).status_code == 400
    assert csrf_post(admin, "/t/acme/insights/api-keys", {"name": ""}).status_code == 400
    assert ApiKey.objects.count() == 0


# --- manage.py apikey ----------------------------------------------------------------------

def test_given_the_cli_when_creating_listing_and_revoking_then_the_key_lifecycle_works():
    out, err = io.StringIO(), io.StringIO()
    call_command("apikey", "create", "--tenant", "acme", "--project", "docs", "--name", "ci agent", "--by", "ops",
                 stdout=out, stderr=err)
    plaintext = out.getvalue().strip().splitlines()[-1]
    key = keys.authenticate(plaintext)
    assert key.created_by == "ops" and "shown only once" in err.getvalue()
    listing = io.StringIO()
    call_command("apikey", "list", "--tenant", "acme", stdout=listing)
    assert key.prefix in listing.getvalue() and "active" in listing.getvalue() and plaintext not in listing.getvalue()
    call_command("apikey", "revoke", key.prefix, "--tenant", "acme", stdout=io.StringIO())
    with pytest.raises(Unauthenticated):
        keys.authenticate(plaintext)
    with pytest.raises(CommandError, match="API_KEY_NOT_FOUND"):
        call_command("apikey", "revoke", key.prefix, "--tenant", "globex")
    with pytest.raises(CommandError, match="INVALID_REQUEST"):
        call_command("apikey", "create", "--tenant", "$bad", "--name", "x")


# --- keys name existing scopes -------------------------------------------------------------

@pytest.mark.parametrize("tenant_id, project_id, error", [
    ("nosuch", None, UnknownTenant),
    ("acme", "nosuch", UnknownProject),
    ("globex", "docs", UnknownProject),  # acme's project, not globex's
])
def test_given_a_scope_that_does_not_exist_when_creating_a_key_then_a_typed_error_and_nothing_written(
        tenant_id, project_id, error):
    with pytest.raises(error, match="nosuch|docs"):
        keys.create_key(tenant_id=tenant_id, project_id=project_id, name="k", acting_user="a")
    assert ApiKey.objects.count() == 0 and store.audit().count_documents({}) == 0


@pytest.mark.parametrize("args, code", [
    (["--tenant", "nosuch"], "UNKNOWN_TENANT"),
    (["--tenant", "acme", "--project", "nosuch"], "UNKNOWN_PROJECT"),
])
def test_given_the_cli_and_an_unknown_scope_when_creating_a_key_then_it_exits_non_zero_with_the_code(args, code):
    out = io.StringIO()
    with pytest.raises(CommandError, match=code) as raised:
        call_command("apikey", "create", *args, "--name", "x", stdout=out, stderr=io.StringIO())
    assert raised.value.returncode != 0 and "vlk_" not in out.getvalue()
    assert ApiKey.objects.count() == 0


def test_given_a_project_deleted_after_the_form_was_shown_when_creating_then_400_with_the_reason(tenant):
    admin = user_with(tenant, Membership.Role.ADMIN, "ada")
    page = admin.get("/t/acme/insights/api-keys")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    Project.objects.filter(slug="docs").delete()
    response = admin.post("/t/acme/insights/api-keys", {"name": "x", "project": "docs", "csrfmiddlewaretoken": token})
    assert response.status_code == 400 and ApiKey.objects.count() == 0


@pytest.mark.parametrize("delete", ["tenant", "project"])
def test_given_a_key_whose_scope_was_deleted_when_authenticating_then_refused(delete):
    key, plaintext = keys.create_key(tenant_id="acme", project_id="docs", name="k", acting_user="a")
    assert keys.authenticate(plaintext).pk == key.pk
    if delete == "tenant":
        Tenant.objects.filter(slug="acme").delete()
    else:
        Project.objects.filter(slug="docs").delete()
    with pytest.raises(ApiKeyScopeGone, match="acme"):
        keys.authenticate(plaintext)
