"""Insights → API keys in a real browser: Debian's Chromium (headless, via Playwright)
against gunicorn. A tenant admin creates a key (shown once), uses it over HTTP, revokes it.
Screenshots land in docs/screenshots/.
"""

from __future__ import annotations

import re

import pytest
import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from insights.models import Membership, Project, Tenant
from tests.browser import SHOTS, chromium
from tests.http_server import running_server

PASSWORD = "demo-pass-123"


@pytest.fixture(scope="module")
def server(django_db_setup):
    with running_server(workers=1, threads=4) as base_url:
        yield base_url


@pytest.fixture
def page():
    with chromium() as browser:
        yield browser.new_page(viewport={"width": 1280, "height": 800})


def _admin():
    tenant = Tenant.objects.create(slug="acme", name="Acme Corp")
    Project.objects.create(tenant=tenant, slug="docs", name="Docs")
    user = get_user_model().objects.create_user("acme-admin")
    hasher = PBKDF2PasswordHasher()  # the server process runs the production hashers
    user.password = hasher.encode(PASSWORD, hasher.salt(), iterations=1000)
    user.save()
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.ADMIN)


def test_given_a_tenant_admin_in_chromium_when_creating_using_and_revoking_a_key_then_it_works_end_to_end(server, page):
    _admin()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{server}/t/acme/insights/api-keys")
    page.fill("#id_username", "acme-admin")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/t/acme/insights/api-keys$"))
    page.fill("#id_name", "mcp-server prod")
    page.select_option("#id_project", "docs")
    page.click("#create-key button[type=submit]")
    plaintext = page.text_content("#plaintext").strip()
    assert plaintext.startswith("vlk_")
    page.screenshot(path=str(SHOTS / "api-keys-created.png"), full_page=True)

    grant = requests.post(f"{server}/api/v1/leases", timeout=10, headers={"Authorization": f"Bearer {plaintext}"},
                          json={"type": "tex", "projectId": "docs", "userId": "u1",
                                "inline": {"name": "k", "levels": {"user": 1}}})
    assert grant.status_code == 201

    page.goto(f"{server}/t/acme/insights/api-keys")
    assert plaintext not in page.content()  # shown once: a reload never shows it again
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("form[action$='/revoke'] button")
    page.wait_for_selector(".chip.bad")
    assert "revoked" in page.text_content("table")
    page.screenshot(path=str(SHOTS / "api-keys-revoked.png"), full_page=True)
    again = requests.post(f"{server}/api/v1/leases/{grant.json()['token']}/renew", timeout=10,
                          headers={"Authorization": f"Bearer {plaintext}"})
    assert again.status_code == 401
