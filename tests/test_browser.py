"""Insights → Leases in a real browser: Debian's Chromium (headless, via Playwright) against
the app running as a real server process. Screenshots land in docs/screenshots/.
"""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher

import leases
from insights.models import Membership, Project, Tenant
from leases.definitions import layers as config
from leases.definitions.model import TENANT_PROJECT, document_path
from leases.errors import LeaseLost
from leases.store import client as store
from tests.browser import SHOTS, chromium
from tests.helpers import queue_up
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


def _then_the_login_page_leads_to_the_tenants_own_holders_only(page, app, acme, globex):
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


def _then_filters_survive_the_live_refresh_and_a_new_holder_shows_up(page, acme):
    """Filters survive the live refresh (the fragment URL carries them)."""
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


def _then_counters_show_the_tenants_own_keys_and_flag_the_drift(page):
    page.click("nav.tabs >> text=Counters")
    page.wait_for_load_state()
    keys = page.locator("tr[data-key]").evaluate_all("rs => rs.map(r => r.dataset.key)")
    assert "tex2pdf|tenant|acme" in keys and "tex2pdf|project|acme/docs" in keys
    assert not any(k.endswith("|*") or "globex" in k for k in keys)
    drift_row = page.locator('tr[data-key="tex2pdf|tenant|acme"]')
    assert "drift 4≠3" in drift_row.inner_text()
    assert "1 counter drifted" in page.content()
    _shot(page, "counters")


def _then_the_definition_names_each_levels_source(page):
    page.click("nav.tabs >> text=Definition")
    page.fill("#id_name", "tex")
    page.select_option("#id_project", "docs")
    page.click("text=Show definition")
    page.wait_for_load_state()
    table = page.locator("table").inner_text()
    assert "levels.project\t2\tproject" in table and "levels.tenant\t3\ttenant" in table
    assert "levels.global\t6\tclasspath" in table
    _shot(page, "definition")


def _when_the_admin_revokes_a_holder_after_confirming(page, app, victim):
    """Revoke alice's compile: details → confirmation step → revoked."""
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


def _then_it_is_gone_lost_tombstoned_audited_and_handled_on_the_app_pod(page, app, acme, victim):
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


def _then_the_other_tenants_admin_finds_none_of_its_data(page, app, acme, globex):
    """Tenant B's admin finds none of A's data."""
    page.click("text=Log out")
    page.wait_for_load_state()
    _login(page, f"{app.url}/t/globex/insights/leases", "globex-admin")
    body = page.content()
    assert page.locator("tr[data-token]").evaluate_all("rs => rs.map(r => r.dataset.token)") == [globex[0].token]
    assert not any(h.token in body for h in acme) and "handbook" not in body
    _shot(page, "globex-holders")
    page.goto(f"{app.url}/t/globex/insights/leases/counters")
    assert "acme" not in page.locator("#live").inner_text()
    for url in ("/t/acme/insights/leases", "/t/acme/insights/leases/counters",
                f"/t/acme/insights/leases/holders/{acme[1].token}",
                f"/t/globex/insights/leases/holders/{acme[1].token}"):
        response = page.goto(app.url + url)
        assert response.status == 404, url
        assert acme[1].token not in page.content()
    _shot(page, "globex-404")
    acme[1].check()


def test_admin_sees_holders_counters_definition_revokes_and_other_tenant_sees_nothing(app, browser, world):
    acme, globex = world
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    try:
        _then_the_login_page_leads_to_the_tenants_own_holders_only(page, app, acme, globex)
        _then_filters_survive_the_live_refresh_and_a_new_holder_shows_up(page, acme)
        _then_counters_show_the_tenants_own_keys_and_flag_the_drift(page)
        _then_the_definition_names_each_levels_source(page)
        _when_the_admin_revokes_a_holder_after_confirming(page, app, acme[0])
        _then_it_is_gone_lost_tombstoned_audited_and_handled_on_the_app_pod(page, app, acme, acme[0])
        _then_the_other_tenants_admin_finds_none_of_its_data(page, app, acme, globex)
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


def _queue_up(tenant, project, user):
    return queue_up(leases.LeaseRequest(type="tex", lease="tex", tenant_id=tenant, project_id=project, user_id=user,
                                        holder_ref=f"compile:{user}.tex", pod="", wait_ms=60_000),
                    "tex2pdf|global|*")


def test_waiting_tab_shows_own_queue_places_and_blocking_levels_and_counters_flag_a_full_global_level(app, browser,
                                                                                                      settings):
    # The waiters run in this process: their tickets stay fresh for 30 s, so a keep-alive
    # delayed on a loaded machine cannot reorder the queue under the assertions.
    settings.LEASES_TICKET_TTL_MS = 30_000
    register_pod(app)
    _tenant("acme", "Acme Corp", ["docs", "web"])
    _tenant("globex", "Globex Inc", ["research"])
    # tex2pdf: global 6 (bundled). acme may hold 3, 2 of them in docs; globex 4.
    config.put_document("acme", TENANT_PROJECT, document_path("tex"), "levels:\n  tenant: 3\nttlSeconds: 600\n")
    config.put_document("acme", "docs", document_path("tex"), "levels:\n  project: 2\n")
    config.put_document("acme", "web", document_path("tex"), "levels:\n  project: 2\n")
    config.put_document("globex", TENANT_PROJECT, document_path("tex"), "levels:\n  tenant: 4\nttlSeconds: 600\n")
    config.put_document("globex", "research", document_path("tex"), "levels:\n  project: 4\n")
    held = [_hold("tex", "tex", "acme", "docs", user, f"compile:{user}.tex", {}) for user in ("alice", "bob")]
    held += [_hold("tex", "tex", "globex", "research", f"g{n}", f"compile:g{n}.tex", {}) for n in range(4)]
    # The global level is now full (6/6): acme's carol waits at the shared level, globex's
    # hank at its own levels, and acme's alice at her project (docs 2/2).
    waiters = [_queue_up("acme", "web", "carol"), _queue_up("globex", "research", "hank"),
               _queue_up("acme", "docs", "alice")]
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    try:
        _login(page, f"{app.url}/t/acme/insights/leases/counters", "acme-admin")
        # Counters: acme's own levels have room, and its rows say the shared level is full.
        tenant_row = page.locator('tr[data-key="tex2pdf|tenant|acme"]')
        assert "2 / 3" in tenant_row.inner_text() and "global level full" in tenant_row.inner_text()
        assert "global level full" in page.locator('tr[data-key="tex2pdf|project|acme/web"]').inner_text()
        notice = page.locator("#global-full-notice").inner_text()
        assert "tex2pdf" in notice and "shared with other tenants" in notice
        live = page.locator("#live").inner_text()
        assert "6 / 6" not in live and "globex" not in live and "*" not in live
        _shot(page, "counters-global-full")

        # Counter → the holders that book it.
        page.click('tr[data-key="tex2pdf|project|acme/docs"] >> text=Holders')
        page.wait_for_load_state()
        assert sorted(page.locator("tr[data-token]").evaluate_all("rs => rs.map(r => r.dataset.token)")) == sorted(
            h.token for h in held[:2])

        page.click("nav.tabs >> text=Waiting")
        page.wait_for_load_state()
        rows = page.locator("tr[data-ticket]")
        assert rows.evaluate_all("rs => rs.map(r => r.dataset.ticket)") == [waiters[0].ticket, waiters[2].ticket]
        carol, alice = rows.nth(0).inner_text(), rows.nth(1).inner_text()
        # carol is first in the whole queue (acme holds fewer than globex); hank (globex,
        # blocked by its own caps) sits between, so alice is third — hank is never shown.
        assert "#1" in carol and "carol" in carol and "blocked at the global level, shared with other tenants" in carol
        assert "#3" in alice and "alice" in alice and "tex2pdf|project|acme/docs" in alice and "2 / 2" in alice
        body = page.locator("main").inner_text()
        assert "hank" not in body and "globex" not in body and waiters[1].ticket not in page.content()
        assert "6 / 6" not in body
        _shot(page, "waiting")

        # A new waiter shows up by itself (live-region refresh), without a reload.
        page.evaluate("window.__noReload = true")
        waiters.append(_queue_up("acme", "web", "dora"))
        page.wait_for_selector(f'tr[data-ticket="{waiters[-1].ticket}"]', timeout=12_000)
        assert page.evaluate("window.__noReload") is True

        # The blocking level's link lists alice's and bob's holders.
        page.click(f'tr[data-ticket="{waiters[2].ticket}"] >> text=tex2pdf|project|acme/docs')
        page.wait_for_load_state()
        assert page.locator("tr[data-token]").count() == 2

        # The other tenant sees its own ticket and nothing of acme's.
        page.click("text=Log out")
        page.wait_for_load_state()
        _login(page, f"{app.url}/t/globex/insights/leases/waiting", "globex-admin")
        assert page.locator("tr[data-ticket]").evaluate_all("rs => rs.map(r => r.dataset.ticket)") == [waiters[1].ticket]
        assert "carol" not in page.content() and "alice" not in page.content()
        assert "#2" in page.locator("tr[data-ticket]").inner_text()
    finally:
        context.close()
        for lease in held:
            lease.release()
        for waiter in waiters:
            waiter.join(30)
            if waiter.lease is not None:
                waiter.lease.release()


def test_holder_links_to_its_definition_revocation_to_its_audit_entry_and_api_keys_is_a_tab(app, browser, world):
    acme, _ = world
    from leases.ops import actions

    actions.revoke_holder(acme[1].token, tenant_id="acme", acting_user="acme-admin", reason="stuck compile")
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    try:
        _login(page, f"{app.url}/t/acme/insights/leases", "acme-admin")
        page.click(f'tr[data-token="{acme[0].token}"] >> a.def-link')
        page.wait_for_load_state()
        assert "/definition?name=tex&project=docs" in page.url
        assert "levels.project\t2\tproject" in page.locator("table").inner_text()

        page.goto(f"{app.url}/t/acme/insights/leases")
        page.click("tr[data-audit] >> text=Audit entry")
        page.wait_for_load_state()
        entry = page.locator("#audit-entry").inner_text()
        assert acme[1].token in entry and "stuck compile" in entry and "acme-admin" in entry
        _shot(page, "audit-entry")

        page.click("nav.tabs >> text=API keys")
        page.wait_for_load_state()
        assert page.url == f"{app.url}/t/acme/insights/api-keys"
        assert page.locator("nav.tabs a.active").inner_text() == "API keys"
    finally:
        context.close()
