"""Insights → Leases → History in Debian's Chromium (Playwright) against the app running as
a real server process, with minutes the engine recorded in this test: real grants, busy
answers, queued waits and a revocation. The screenshot lands in docs/screenshots/history.png.
"""

from __future__ import annotations

import threading

import pytest

import leases
from leases.definitions import layers as config
from leases.definitions.model import TENANT_PROJECT, document_path
from leases.revocation import handlers
from leases.telemetry import history
from leases.upkeep import reaper
from tests.browser import SHOTS, chromium, requires_chromium
from tests.live_app import register_pod, running_app
from tests.test_browser import _login, _tenant

APP_POD = "history-browser-pod"

pytestmark = requires_chromium


@pytest.fixture(scope="module")
def app(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock(), running_app(APP_POD) as live:
        yield live


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


def _req(tenant, project, user, wait_ms):
    return leases.LeaseRequest(type="histbrowser", lease="tex", tenant_id=tenant, project_id=project,
                               user_id=user, holder_ref=f"compile:{user}.tex", pod="", wait_ms=wait_ms)


class _Handler(handlers.LeaseHandler):
    type = "histbrowser"

    def on_revoked(self, holder):
        pass


def _traffic():
    """Real acquisitions of tex2pdf (acme: tenant cap 3; the gate is the global level) through
    the engine; returns what acme saw."""
    seen = {"granted": 0, "busy": 0}
    held = [leases.acquire(_req("acme", "docs", f"u{n}", 0)) for n in range(1)]
    held += [leases.acquire(_req("acme", "web", f"w{n}", 0)) for n in range(2)]
    seen["granted"] += 3
    for n in range(4):  # the tenant level is full: busy at once
        with pytest.raises(leases.LeaseBusy):
            leases.acquire(_req("acme", "web", f"late{n}", 0))
        seen["busy"] += 1
    results = []

    def wait_for_one(user):
        results.append(leases.acquire(_req("acme", "web", user, 8000)))

    waiters = [threading.Thread(target=wait_for_one, args=(f"q{n}",)) for n in range(2)]
    for t in waiters:
        t.start()
    _until(lambda: len((leases.store.client.counters().find_one({"_id": "tex2pdf|global|*"}) or {}).get("queue") or []) == 2)
    held.pop().release()
    held.pop().release()
    for t in waiters:
        t.join(15)
    assert len(results) == 2
    seen["granted"] += 2
    reaper.reap({"_id": held.pop().token}, "revoke")
    for lease in results:
        lease.release()
    other = leases.acquire(_req("globex", "research", "dave", 0))  # another tenant's traffic
    other.release()
    return seen


def _until(check, timeout=10.0):
    import time

    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def test_the_history_tab_charts_the_minutes_the_engine_recorded(app, browser):
    register_pod(app)
    handlers.register_handler(_Handler())
    try:
        _tenant("acme", "Acme Corp", ["docs", "web"])
        _tenant("globex", "Globex Inc", ["research"])
        config.put_document("acme", TENANT_PROJECT, document_path("tex"), "levels:\n  tenant: 3\n  project: 3\n")
        history.recorder.aggregator.drain()
        seen = _traffic()
        assert history.flush() >= 1
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        try:
            _login(page, f"{app.url}/t/acme/insights/leases", "acme-admin")
            page.click("nav.tabs >> text=History")
            page.wait_for_load_state()
            assert page.url.endswith("/t/acme/insights/leases/history")
            totals = page.locator(".card.totals").inner_text()
            assert f"{seen['granted']} granted" in totals and f"{seen['busy']} busy" in totals
            assert "2 waited" in totals and "1 reaped: 1 revoke" in totals
            # The waiters saw acme's 3 slots on the gate; the tenant cap of 3 is never exceeded.
            assert "peak 3 slots" in totals
            assert page.locator("svg.history").count() == 4
            # The numbers of a bar are its <title> (shown on hover) and in the table below.
            titles = page.locator('[data-chart="grants"] svg rect title').evaluate_all(
                "ts => ts.map(t => t.textContent)")
            # The traffic may straddle a minute boundary: the bars add up to it either way.
            assert sum(int(t.rsplit(": ", 1)[1].split()[0]) for t in titles if t.endswith(" granted")) == seen["granted"]
            assert sum(int(t.rsplit(": ", 1)[1].split()[0]) for t in titles if t.endswith(" busy")) == seen["busy"]
            assert page.locator('[data-chart="wait"] svg circle').count() >= 2
            assert page.locator('[data-chart="reaps"] svg rect').count() >= 1
            grants_table = page.locator('[data-chart="grants"] table').inner_text()
            assert sum(int(line.split("\t")[1]) for line in grants_table.splitlines()[1:]) == seen["granted"]
            assert "globex" not in page.content()
            page.locator('[data-chart="grants"] svg rect').first.hover()
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "history.png"), full_page=True)
        finally:
            context.close()
    finally:
        handlers.unregister_handler("histbrowser")
