"""Insights → Leases in a real browser: Debian's Chromium (headless, via Playwright) against
the app running as a real server process. Screenshots land in docs/screenshots/.
"""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher

import leases
from leases import config, store
from leases.definitions import TENANT_PROJECT, document_path
from leases.errors import LeaseLost
from insights.models import Membership, Project, Tenant
from tests.browser import SHOTS, chromium
from tests.live_app import register_pod, running_app

PASSWORD = "demo-pass-123"
APP_POD = "browser-test-pod"


@pytest.fixture(scope="module")
def app(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock(), running_app(APP_POD) as live:
        yield live


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


def _tenant(slug, name, projects):
    tenant = Tenant.objects.create(slug=slug, name=name)
    for project in projects:
        Project.objects.create(tenant=tenant, slug=project, name=project.title())
    admin = get_user_model().objects.create_user(f"{slug}-admin")
    # The app process runs with the production hasher list (tests use MD5 for speed).
    hasher = PBKDF2PasswordHasher()
    admin.password = hasher.encode(PASSWORD, hasher.salt(), iterations=1000)
    admin.save()
    Membership.objects.create(user=admin, tenant=tenant, role=Membership.Role.ADMIN)
    return tenant


def _hold(type_, lease, tenant, project, user, ref, payload):
    held = leases.acquire(leases.LeaseRequest(type=type_, lease=lease, tenant_id=tenant, project_id=project,
                                              user_id=user, holder_ref=ref, pod="", pod_bound=type_ == "tex",
                                              wait_ms=0))
    held.update_payload(payload)
    return held


@pytest.fixture
def world(app):
    register_pod(app)
    _tenant("acme", "Acme Corp", ["docs", "web"])
    _tenant("globex", "Globex Inc", ["research"])
    config.put_document("acme", TENANT_PROJECT, document_path("tex"), "levels:\n  tenant: 3\nttlSeconds: 600\n")
    config.put_document("acme", "docs", document_path("tex"), "levels:\n  project: 2\n")
    config.put_document("acme", TENANT_PROJECT, document_path("browser"), "ttlSeconds: 600\n")
    config.put_document("globex", TENANT_PROJECT, document_path("tex"), "ttlSeconds: 600\n")
    acme = [
        _hold("tex", "tex", "acme", "docs", "alice", "compile:handbook.tex", {"jobId": "job-7f3a"}),
        _hold("tex", "tex", "acme", "docs", "bob", "compile:release-notes.tex", {"jobId": "job-7f3b"}),
        _hold("tex", "tex", "acme", "web", "carol", "compile:landing.tex", {"jobId": "job-81c0"}),
        _hold("browser", "browser", "acme", "docs", "alice", "mcp:playwright",
              {"tool": "browser", "endpoint": "http://127.0.0.1:9/mcp", "sessionId": "sess-acme-1"}),
    ]
    globex = [_hold("tex", "tex", "globex", "research", "dave", "compile:paper.tex", {"jobId": "job-g001"})]
    # One drifted counter, as a crash between booking and registering would leave it.
    store.counters().update_one({"_id": "tex2pdf|tenant|acme"}, {"$inc": {"count": 1}})
    return acme, globex


def _login(page, url, username):
    page.goto(url)
    assert "/accounts/login/" in page.url
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def _shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_admin_sees_holders_counters_definition_revokes_and_other_tenant_sees_nothing(app, browser, world):
    acme, globex = world
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    try:
        # Login page, then straight on to the requested page.
        page.goto(f"{app.url}/t/acme/insights/leases")
        _shot(page, "login")
        _login(page, f"{app.url}/t/acme/insights/leases", "acme-admin")
        assert page.url == f"{app.url}/t/acme/insights/leases"

        rows = page.locator("tr[data-token]")
        assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.token)")) == sorted(h.token for h in acme)
        body = page.content()
        assert "compile:handbook.tex" in body and globex[0].token not in body and "compile:paper.tex" not in body
        _shot(page, "holders")

        # Filters survive the live refresh (the fragment URL carries them).
        page.fill("#id_user", "alice")
        page.click("text=Apply filters")
        page.wait_for_load_state()
        assert page.locator("tr[data-token]").count() == 2
        assert "user=alice" in page.locator("#live").get_attribute("data-fragment-url")
        # A new holder shows up by itself (live-region refresh), the filter stays applied
        # and the page is not reloaded (the marker set on window survives).
        page.evaluate("window.__noReload = true")
        config.put_document("acme", TENANT_PROJECT, document_path("search"), "levels: {tenant: 10}\nttlSeconds: 600")
        late = _hold("browser", "search", "acme", "web", "alice", "mcp:late", {})
        acme.append(late)
        page.wait_for_selector(f'tr[data-token="{late.token}"]', timeout=12_000)
        assert page.locator("tr[data-token]").count() == 3
        assert page.evaluate("window.__noReload") is True and page.input_value("#id_user") == "alice"

        page.click("nav.tabs >> text=Counters")
        page.wait_for_load_state()
        keys = page.locator("tr[data-key]").evaluate_all("rs => rs.map(r => r.dataset.key)")
        assert "tex2pdf|tenant|acme" in keys and "tex2pdf|project|acme/docs" in keys
        assert not any(k.endswith("|*") or "globex" in k for k in keys)
        drift_row = page.locator('tr[data-key="tex2pdf|tenant|acme"]')
        assert "drift 4≠3" in drift_row.inner_text()
        assert "1 counter drifted" in page.content()
        _shot(page, "counters")

        page.click("nav.tabs >> text=Definition")
        page.fill("#id_name", "tex")
        page.select_option("#id_project", "docs")
        page.click("text=Show definition")
        page.wait_for_load_state()
        table = page.locator("table").inner_text()
        assert "levels.project\t2\tproject" in table and "levels.tenant\t3\ttenant" in table
        assert "levels.global\t6\tclasspath" in table
        _shot(page, "definition")

        # Revoke alice's compile: details → confirmation step → revoked.
        victim = acme[0]
        page.goto(f"{app.url}/t/acme/insights/leases/holders/{victim.token}")
        assert "job-7f3a" in page.content() and "compile:handbook.tex" in page.content()
        _shot(page, "holder-detail")
        page.goto(f"{app.url}/t/acme/insights/leases")
        page.click(f'tr[data-token="{victim.token}"] >> text=Revoke…')
        page.wait_for_load_state()
        assert "Revoke lease?" in page.content()
        page.click("button.danger")  # without the confirmation tick the form is not sent
        assert page.url.endswith("/revoke") and page.locator("#id_confirm").evaluate("e => !e.validity.valid")
        victim.check()
        page.check("#id_confirm")
        page.fill("#id_reason", "stuck compile")
        _shot(page, "revoke-confirm")
        page.click("button.danger")
        page.wait_for_load_state()
        assert page.url == f"{app.url}/t/acme/insights/leases"
        assert "revoked" in page.locator(".notice.success").inner_text()
        assert page.locator(f'tr[data-token="{victim.token}"]').count() == 0
        assert page.locator("tr[data-token]").count() == len(acme) - 1
        _shot(page, "holders-after-revoke")
        with pytest.raises(LeaseLost):
            victim.check()
        acme[1].check()
        tombstone = store.tombstones().find_one({"_id": victim.token})
        assert tombstone["reason"] == "revoke"
        audit = store.audit().find_one({"token": victim.token})
        assert audit["actor"] == "acme-admin" and audit["tenantId"] == "acme"
        # The app's dispatcher ran the tex handler (detached, so on the revoking pod).
        deadline = time.monotonic() + 5
        while not (store.tombstones().find_one({"_id": victim.token}) or {}).get("handledBy") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.tombstones().find_one({"_id": victim.token})["handledBy"] == APP_POD

        # Tenant B's admin finds none of A's data.
        page.click("text=Log out")
        page.wait_for_load_state()
        _login(page, f"{app.url}/t/globex/insights/leases", "globex-admin")
        body = page.content()
        assert page.locator("tr[data-token]").evaluate_all("rs => rs.map(r => r.dataset.token)") == [globex[0].token]
        assert not any(h.token in body for h in acme) and "handbook" not in body
        _shot(page, "globex-holders")
        page.goto(f"{app.url}/t/globex/insights/leases/counters")
        assert "acme" not in page.locator("#live").inner_text()
        for url in (f"/t/acme/insights/leases", f"/t/acme/insights/leases/counters",
                    f"/t/acme/insights/leases/holders/{acme[1].token}",
                    f"/t/globex/insights/leases/holders/{acme[1].token}"):
            response = page.goto(app.url + url)
            assert response.status == 404, url
            assert acme[1].token not in page.content()
        _shot(page, "globex-404")
        acme[1].check()
    finally:
        context.close()


def test_given_an_over_long_filter_value_then_the_page_keeps_its_width_and_names_the_field(app, browser):
    _tenant("acme", "Acme Corp", ["docs"])
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        _login(page, f"{app.url}/t/acme/insights/leases", "acme-admin")
        response = page.goto(f"{app.url}/t/acme/insights/leases?resource={'x' * 500}&page=abc")
        assert response.status == 400
        # Nothing wider than the window: no horizontal scrolling from an echoed value.
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        errors = page.locator(".errorlist").all_inner_texts()
        assert any("Resource is too long: at most 128 characters." in e for e in errors)
        assert any("Page must be a whole number" in e for e in errors)
        _shot(page, "holders-bad-filters")
    finally:
        context.close()
