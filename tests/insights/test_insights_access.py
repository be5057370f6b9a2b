"""Insights → Leases access: anonymous, member, admin, other tenant's admin (IDOR), CSRF."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

import leases
from insights.models import Membership, Project, Tenant
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.errors import LeaseLost
from leases.store import client as store
from tests.helpers import queue_up as helpers_queue_up, queued_ids, quiet_handler_fixture

handler = quiet_handler_fixture("uitest")


@pytest.fixture
def world():
    """acme and globex with an admin and a member each, and one live holder each."""
    config.put_document("_vance", "_tenant", document_path("uilease"),
                        "resource: uires\nlevels: {global: 10, tenant: 5, user: 2}\nttlSeconds: 120")
    users = {}
    holders = {}
    for slug, project, person in (("acme", "docs", "alice"), ("globex", "research", "dave")):
        tenant = Tenant.objects.create(slug=slug, name=slug.title())
        Project.objects.create(tenant=tenant, slug=project)
        for role in ("admin", "member"):
            user = get_user_model().objects.create_user(f"{slug}-{role}", password="pw-123456")
            Membership.objects.create(user=user, tenant=tenant,
                                      role=Membership.Role.ADMIN if role == "admin" else Membership.Role.MEMBER)
            users[f"{slug}-{role}"] = user
        holders[slug] = leases.acquire(leases.LeaseRequest(
            type="uitest", lease="uilease", tenant_id=slug, project_id=project, user_id=person,
            holder_ref=f"ref-{slug}", pod=""))
    users["outsider"] = get_user_model().objects.create_user("outsider", password="pw-123456")
    return users, holders


def urls(tenant, token):
    base = f"/t/{tenant}/insights/leases"
    return [base, f"{base}?resource=uires", f"{base}?fragment=1", f"{base}/counters", f"{base}/counters?fragment=1",
            f"{base}/waiting", f"{base}/waiting?fragment=1", f"{base}?counter=uires%7Ctenant%7C{tenant}",
            f"{base}/definition?name=uilease&project=_tenant", f"{base}/holders/{token}", f"{base}/holders/{token}/revoke"]


def logged_in(user, **kwargs):
    client = Client(**kwargs)
    client.force_login(user)
    return client


def test_given_anonymous_when_opening_any_page_then_redirected_to_login(world):
    _, holders = world
    client = Client()
    for url in urls("acme", holders["acme"].token):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/?next="), url
    assert client.post(f"/t/acme/insights/leases/holders/{holders['acme'].token}/revoke",
                       {"confirm": "on"}).status_code == 302
    holders["acme"].check()


def test_given_the_admin_then_every_page_answers_with_own_data_only(world):
    users, holders = world
    client = logged_in(users["acme-admin"])
    for url in urls("acme", holders["acme"].token):
        response = client.get(url)
        assert response.status_code == 200, url
        assert holders["globex"].token not in response.content.decode(), url
    page = client.get("/t/acme/insights/leases").content.decode()
    assert holders["acme"].token in page and "ref-acme" in page and "ref-globex" not in page
    counters = client.get("/t/acme/insights/leases/counters").content.decode()
    assert "uires" in counters and "acme/alice" in counters
    assert "globex" not in counters and 'data-key="uires|global|*"' not in counters


@pytest.mark.parametrize("who", ["globex-admin", "outsider"])
def test_given_a_stranger_when_opening_another_tenants_pages_then_404_like_a_missing_tenant(world, who):
    users, holders = world
    client = logged_in(users[who])
    for url in urls("acme", holders["acme"].token) + urls("no-such-tenant", holders["acme"].token):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/t/acme/insights/leases/holders/{holders['acme'].token}/revoke",
                       {"confirm": "on"}).status_code == 404
    holders["acme"].check()


def test_given_the_other_admin_when_using_an_acme_token_under_their_own_tenant_then_404_and_nothing_revoked(world):
    users, holders = world
    client = logged_in(users["globex-admin"])
    token = holders["acme"].token
    assert client.get(f"/t/globex/insights/leases/holders/{token}").status_code == 404
    assert client.get(f"/t/globex/insights/leases/holders/{token}/revoke").status_code == 404
    assert client.post(f"/t/globex/insights/leases/holders/{token}/revoke", {"confirm": "on"}).status_code == 404
    holders["acme"].check()
    assert store.audit().count_documents({}) == 0


def test_given_a_member_who_is_not_admin_then_403_everywhere(world):
    users, holders = world
    client = logged_in(users["acme-member"])
    for url in urls("acme", holders["acme"].token):
        assert client.get(url).status_code == 403, url
    assert client.post(f"/t/acme/insights/leases/holders/{holders['acme'].token}/revoke",
                       {"confirm": "on"}).status_code == 403
    holders["acme"].check()
    # The member's own start page still works and says why there is no link.
    assert "Only admins see lease insights" in client.get("/").content.decode()


@pytest.mark.parametrize("slug", ["%24ne", "a.b", "_vance", "x" * 65])
def test_given_a_malformed_or_reserved_tenant_in_the_url_then_404(world, slug):
    users, _ = world
    assert logged_in(users["acme-admin"]).get(f"/t/{slug}/insights/leases").status_code == 404


@pytest.mark.parametrize("token", ["%24ne", "short", "a" * 65])
def test_given_a_malformed_token_then_404(world, token):
    users, _ = world
    client = logged_in(users["acme-admin"])
    assert client.get(f"/t/acme/insights/leases/holders/{token}").status_code == 404
    assert client.post(f"/t/acme/insights/leases/holders/{token}/revoke", {"confirm": "on"}).status_code == 404


def test_given_a_forged_revoke_post_without_csrf_token_then_403_and_the_holder_stays(world):
    users, holders = world
    client = logged_in(users["acme-admin"], enforce_csrf_checks=True)
    response = client.post(f"/t/acme/insights/leases/holders/{holders['acme'].token}/revoke", {"confirm": "on"})
    assert response.status_code == 403
    holders["acme"].check()
    assert store.holders().count_documents({"tenantId": "acme"}) == 1


def test_given_the_confirmation_step_with_csrf_then_revoked_audited_and_check_raises_lost(world):
    users, holders = world
    client = logged_in(users["acme-admin"], enforce_csrf_checks=True)
    url = f"/t/acme/insights/leases/holders/{holders['acme'].token}/revoke"
    confirm = client.get(url)
    assert confirm.status_code == 200 and "Revoke lease" in confirm.content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', confirm.content.decode()).group(1)

    unconfirmed = client.post(url, {"csrfmiddlewaretoken": csrf})
    assert unconfirmed.status_code == 400 and "Tick the box" in unconfirmed.content.decode()
    holders["acme"].check()

    done = client.post(url, {"csrfmiddlewaretoken": csrf, "confirm": "on", "reason": "stuck"})
    assert done.status_code == 302 and done["Location"] == "/t/acme/insights/leases"
    with pytest.raises(LeaseLost):
        holders["acme"].check()
    audit = store.audit().find_one({"token": holders["acme"].token})
    assert audit["actor"] == "acme-admin" and audit["tenantId"] == "acme" and audit["reason"] == "stuck"
    after = client.get("/t/acme/insights/leases").content.decode()
    assert "revoked" in after and "No leases are held in this tenant" in after
    holders["globex"].check()


# A user id may be any username or email ('{"$gt":""}' is one: matched as a plain string), so
# the refused user filter is one with whitespace inside.
@pytest.mark.parametrize("query", ["resource=%24ne", "pod=a%20b", "user=%7B%22%24gt%22%3A%20%22%22%7D", "project=..%2Fx"])
def test_given_operator_like_filters_then_400_with_a_form_error_and_no_rows(world, query):
    users, holders = world
    response = logged_in(users["acme-admin"]).get(f"/t/acme/insights/leases?{query}")
    assert response.status_code == 400
    body = response.content.decode()
    assert "errorlist" in body and holders["acme"].token not in body


def test_given_an_email_user_filter_then_the_holders_of_that_user_are_listed(world):
    users, _ = world
    mine = leases.acquire(leases.LeaseRequest(type="uitest", lease="uilease", tenant_id="acme", project_id="docs",
                                              user_id="bob@example.com", pod=""))
    response = logged_in(users["acme-admin"]).get("/t/acme/insights/leases?user=bob%40example.com")
    assert response.status_code == 200
    assert mine.token in response.content.decode()
    mine.release()


def test_given_filters_then_refresh_fragment_keeps_them(world):
    users, holders = world
    client = logged_in(users["acme-admin"])
    page = client.get("/t/acme/insights/leases?user=bob").content.decode()
    assert 'data-fragment-url="?user=bob&amp;fragment=1"' in page
    assert "No holder matches these filters" in page
    fragment = client.get("/t/acme/insights/leases?user=alice&fragment=1").content.decode()
    assert holders["acme"].token in fragment and "<html" not in fragment
    assert '<meta http-equiv="refresh" content="5">' in page  # the no-JavaScript fallback
    paused = client.get("/t/acme/insights/leases?refresh=off").content.decode()
    assert 'http-equiv="refresh"' not in paused and "Auto-refresh paused" in paused


def test_given_a_definition_request_for_a_project_of_another_tenant_then_form_error(world):
    users, _ = world
    response = logged_in(users["acme-admin"]).get("/t/acme/insights/leases/definition?name=uilease&project=research")
    assert response.status_code == 400 and "Select a valid choice" in response.content.decode()


def test_login_and_logout_pages_work(world):
    users, _ = world
    client = Client(enforce_csrf_checks=True)
    login = client.get("/accounts/login/?next=/t/acme/insights/leases")
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.content.decode()).group(1)
    response = client.post("/accounts/login/", {"username": "acme-admin", "password": "pw-123456",
                                                "next": "/t/acme/insights/leases", "csrfmiddlewaretoken": csrf})
    assert response.status_code == 302 and response["Location"] == "/t/acme/insights/leases"
    home = client.get("/")
    assert "Insights → Leases" in home.content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', home.content.decode()).group(1)
    assert client.post("/accounts/logout/", {"csrfmiddlewaretoken": csrf}).status_code == 302
    assert client.get("/t/acme/insights/leases").status_code == 302


def test_django_admin_edits_tenants_projects_memberships_and_refuses_bad_slugs(world):
    users, _ = world
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456")
    client = logged_in(root)
    for url in ("/admin/insights/tenant/", "/admin/insights/project/", "/admin/insights/membership/",
                "/admin/insights/tenant/add/", f"/admin/insights/tenant/{Tenant.objects.get(slug='acme').pk}/change/"):
        assert client.get(url).status_code == 200, url
    bad = client.post("/admin/insights/tenant/add/", {
        "slug": "$bad", "name": "Bad", "projects-TOTAL_FORMS": "0", "projects-INITIAL_FORMS": "0",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})
    assert bad.status_code == 200 and not Tenant.objects.filter(name="Bad").exists()
    good = client.post("/admin/insights/tenant/add/", {
        "slug": "initech", "name": "Initech", "projects-TOTAL_FORMS": "1", "projects-INITIAL_FORMS": "0",
        "projects-0-slug": "tps", "projects-0-name": "TPS", "memberships-TOTAL_FORMS": "1",
        "memberships-INITIAL_FORMS": "0", "memberships-0-user": str(users["outsider"].pk), "memberships-0-role": "ADMIN"})
    assert good.status_code == 302
    initech = Tenant.objects.get(slug="initech")
    assert Project.objects.filter(tenant_id=initech.pk, slug="tps").exists()
    assert Membership.objects.get(tenant_id=initech.pk, user_id=users["outsider"].pk).is_admin
    # The new admin now passes the access check for that tenant.
    assert logged_in(users["outsider"]).get("/t/initech/insights/leases").status_code == 200


def revocations_section(client, tenant="acme"):
    page = client.get(f"/t/{tenant}/insights/leases").content.decode()
    return page.split("<h2>Recent revocations</h2>", 1)[1]


def test_given_api_key_changes_after_a_revocation_then_recent_revocations_shows_only_the_revocation(world):
    from leases.api import keys
    from leases.ops import actions

    users, holders = world
    # Given one revocation, then more API-key creations and a key revocation than the list holds
    actions.revoke_holder(holders["acme"].token, tenant_id="acme", acting_user="acme-admin", reason="stuck")
    for number in range(6):
        key, _ = keys.create_key(tenant_id="acme", name=f"k{number}", acting_user="cli:root")
    keys.revoke_key(tenant_id="acme", prefix=key.prefix, acting_user="cli:root")
    # When the admin opens the holders page
    section = revocations_section(logged_in(users["acme-admin"]))
    # Then the revocation is listed and no key management is
    assert holders["acme"].token[:13] in section and "stuck" in section
    assert "cli:root" not in section and "None" not in section
    assert section.count("<tr data-audit=") == 1


# --- filter input, paging, wording, 403 logging ----------------------------------------------

def error_items(body):
    return re.findall(r'<ul class="errorlist"[^>]*>(.*?)</ul>', body, re.S)


@pytest.mark.parametrize("field, limit", [("resource", 128), ("type", 64), ("pod", 128), ("project", 64), ("user", 150)])
def test_given_an_over_long_filter_value_then_400_with_a_short_message_that_does_not_echo_it(world, field, limit):
    users, holders = world
    value = "x" * 500
    response = logged_in(users["acme-admin"]).get(f"/t/acme/insights/leases?{field}={value}")
    body = response.content.decode()
    assert response.status_code == 400 and holders["acme"].token not in body
    errors = " ".join(error_items(body))
    assert f"at most {limit} characters" in errors and "xxxxxxxxxx" not in errors
    live = body.split("Fix the filters above", 1)[1].split("<h2>", 1)[0]
    assert f"at most {limit} characters" in live and "xxxxxxxxxx" not in live


@pytest.mark.parametrize("page", ["abc", "0", "-3", "99999999"])
def test_given_a_bad_page_number_then_400_and_the_page_field_is_named_with_what_is_wrong(world, page):
    users, holders = world
    response = logged_in(users["acme-admin"]).get(f"/t/acme/insights/leases?page={page}")
    body = response.content.decode()
    assert response.status_code == 400 and holders["acme"].token not in body
    assert 'data-field="page"' in body and "Page must be a whole number from 1 to 1000000." in body
    live = body.split("Fix the filters above", 1)[1].split("<h2>", 1)[0]
    assert "Page</span> Page must be a whole number" in live


def test_given_a_detached_pod_bound_holder_when_confirming_a_revoke_then_no_stray_space_before_the_full_stop(world):
    users, _ = world
    held = leases.acquire(leases.LeaseRequest(type="uitest", lease="uilease", tenant_id="acme", project_id="docs",
                                              user_id="bob", pod="", pod_bound=True))
    body = logged_in(users["acme-admin"]).get(f"/t/acme/insights/leases/holders/{held.token}/revoke").content.decode()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", body))
    notice = text[text.index("Revoking is a reap"):text.index("The holder notices")]
    assert notice.rstrip().endswith("so pod-bound does not apply).") and " ." not in notice


def test_given_a_member_who_is_not_admin_then_the_403_is_logged_once_without_a_traceback(world, caplog):
    users, _ = world
    with caplog.at_level("INFO"):
        response = logged_in(users["acme-member"]).get("/t/acme/insights/leases")
    assert response.status_code == 403 and "Only tenant admins" in response.content.decode()
    forbidden = [r for r in caplog.records if r.levelname != "DEBUG" and "Forbidden" in r.getMessage()]
    assert len(forbidden) == 1 and forbidden[0].exc_info is None


def test_given_debug_on_when_django_logs_a_warning_then_it_is_printed_once():
    import subprocess

    from tests.helpers import PYTHON, REPO, child_env

    probe = ("import django; django.setup(); import logging; "
             "logging.getLogger('django.request').warning('Forbidden: /probe')")
    result = subprocess.run([PYTHON, "-c", probe], cwd=REPO, env=child_env(DJANGO_DEBUG="1"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (result.stdout + result.stderr).count("Forbidden: /probe") == 1


def test_given_only_a_tenant_document_when_viewing_the_definition_tenant_wide_then_ttl_is_from_the_tenant_layer(world):
    users, _ = world
    config.put_document("acme", "_tenant", document_path("browser"), "ttlSeconds: 45")
    body = logged_in(users["acme-admin"]).get("/t/acme/insights/leases/definition?name=browser&project=_tenant").content.decode()
    row = re.search(r"ttlSeconds.*?</tr>", body, re.S).group(0)
    assert "45" in row and "layer-tenant" in row and "layer-project" not in row



def test_given_a_definition_request_without_a_project_then_it_shows_the_tenant_wide_view(world):
    users, _ = world
    config.put_document("acme", "_tenant", document_path("browser"), "ttlSeconds: 45")
    response = logged_in(users["acme-admin"]).get("/t/acme/insights/leases/definition?name=browser")
    assert response.status_code == 200, response.content.decode()[-1500:]
    row = re.search(r"ttlSeconds.*?</tr>", response.content.decode(), re.S).group(0)
    assert "45" in row and "layer-tenant" in row and "layer-project" not in row


def test_given_a_host_brand_then_the_insights_pages_carry_it_instead_of_the_seed_name(world, settings):
    users, _ = world
    settings.LEASES_BRAND = "Acme Cloud"
    login = Client().get("/accounts/login/").content.decode()
    assert "<title>Sign in · Acme Cloud</title>" in login and "Acme Cloud Insights" in login
    page = logged_in(users["acme-admin"]).get("/t/acme/insights/leases").content.decode()
    assert "Acme Cloud <span>Insights</span>" in page and " · Acme Cloud</title>" in page
    assert "Vance" not in login + page

# --- waiting, the global-full flag, links between the views ----------------------------------

def queued():
    return queued_ids("qres|global|*")


def queue_up(tenant, project, user):
    """Start a waiter; return it once its ticket (``waiter.ticket``) is in the queue."""
    return helpers_queue_up(leases.LeaseRequest(type="uitest", lease="qlease", tenant_id=tenant, project_id=project,
                                                user_id=user, pod="", wait_ms=30_000), "qres|global|*")


def q_hold(tenant, project, user):
    return leases.acquire(leases.LeaseRequest(type="uitest", lease="qlease", tenant_id=tenant, project_id=project,
                                              user_id=user, pod="", wait_ms=0))


@pytest.fixture
def queue(world, settings):
    """qres's global level full (globex holds both slots); globex's dave, then acme's alice
    and carol wait (the global level blocks them all). Tickets stay fresh for 30 s, so a
    keep-alive delayed on a loaded machine cannot reorder them."""
    settings.LEASES_TICKET_TTL_MS = 30_000
    config.put_document("_vance", "_tenant", document_path("qlease"),
                        "resource: qres\nlevels: {global: 2, tenant: 4}\nttlSeconds: 60\nwaitMs: 30000")
    held = [q_hold("globex", "research", "dave"), q_hold("globex", "research", "erin")]
    waiters = [queue_up("globex", "research", "frank"), queue_up("acme", "docs", "alice"),
               queue_up("acme", "docs", "carol")]
    yield held, waiters
    for lease in held:
        lease.release()
    for waiter in waiters:
        waiter.join(30)
        if waiter.lease is not None:
            waiter.lease.release()


def test_given_waiters_of_two_tenants_then_the_waiting_tab_lists_only_the_own_with_place_and_shared_level(world, queue):
    users, _ = world
    _, waiters = queue
    client = logged_in(users["acme-admin"])
    page = client.get("/t/acme/insights/leases/waiting").content.decode()
    rows = re.findall(r'<tr data-ticket="([^"]+)">(.*?)</tr>', page, re.S)
    # Then: acme's two tickets (acme holds nothing, so they are first and second), not globex's.
    assert [ticket for ticket, _ in rows] == [waiters[1].ticket, waiters[2].ticket]
    assert ["#1" in body and "alice" in body for _, body in rows] == [True, False]
    assert "#2" in rows[1][1] and "carol" in rows[1][1]
    assert all("blocked at the global level, shared with other tenants" in body for _, body in rows)
    assert waiters[0].ticket not in page and "frank" not in page and "globex" not in page
    assert "2 / 2" not in page and "qres|global|*" not in page  # no numbers of the shared level
    assert "global level full" in page
    assert '<meta http-equiv="refresh" content="5">' in page
    fragment = client.get("/t/acme/insights/leases/waiting?fragment=1").content.decode()
    assert waiters[1].ticket in fragment and "<html" not in fragment and "frank" not in fragment
    # The other tenant sees its own single ticket, third in line, and none of acme's.
    other = logged_in(users["globex-admin"]).get("/t/globex/insights/leases/waiting").content.decode()
    assert waiters[0].ticket in other and "#3" in other
    assert "alice" not in other and waiters[1].ticket not in other


def test_given_nothing_waits_then_the_waiting_tab_says_so(world):
    users, _ = world
    page = logged_in(users["acme-admin"]).get("/t/acme/insights/leases/waiting").content.decode()
    assert "Nothing is waiting" in page and "data-ticket" not in page


def test_given_a_full_global_level_then_the_counters_page_flags_the_tenants_rows_without_global_numbers(world, queue):
    users, _ = world
    client = logged_in(users["acme-admin"])
    # acme's qres tenant counter exists from an earlier use (0 of 4 booked); its waiting
    # requests hold nothing, so they do not create it.
    from leases.definitions import model as definitions
    from leases.queue import slots
    spec = next(s for s in definitions.resolve("qlease", "acme", "docs").level_specs("acme", "docs", "alice")
                if s.level == "tenant")
    slots.create(spec, "qres")
    page = client.get("/t/acme/insights/leases/counters").content.decode()
    row = re.search(r'<tr data-key="qres\|tenant\|acme">(.*?)</tr>', page, re.S).group(1)
    assert "global level full" in row
    other = re.search(r'<tr data-key="uires\|tenant\|acme">(.*?)</tr>', page, re.S).group(1)
    assert "global level full" not in other
    assert "0 / 4" in row and "Busy above your tenant" in page and "2 / 2" not in page and "globex" not in page


def test_given_a_counter_row_then_it_links_to_exactly_the_holders_that_book_it(world):
    users, holders = world
    client = logged_in(users["acme-admin"])
    other = leases.acquire(leases.LeaseRequest(type="uitest", lease="uilease", tenant_id="acme", project_id="docs",
                                               user_id="bob", pod=""))
    page = client.get("/t/acme/insights/leases/counters").content.decode()
    link = re.search(r'<tr data-key="uires\|user\|acme/alice">.*?href="([^"]+)"', page, re.S).group(1)
    assert link == "/t/acme/insights/leases?counter=uires%7Cuser%7Cacme%2Falice"
    listed = client.get(link).content.decode()
    assert holders["acme"].token in listed and other.token not in listed
    # Another tenant's counter key under acme's URL finds nothing of globex.
    foreign = client.get("/t/acme/insights/leases?counter=uires%7Cuser%7Cglobex%2Fdave").content.decode()
    assert holders["globex"].token not in foreign and "No holder matches these filters" in foreign
    bad = client.get("/t/acme/insights/leases?counter=%7B%22%24ne%22%3A1%7D")
    assert bad.status_code == 400 and "invalid counter key" in bad.content.decode()
    other.release()


def test_given_a_holder_then_its_row_and_detail_link_to_its_definition(world):
    users, holders = world
    client = logged_in(users["acme-admin"])
    page = client.get("/t/acme/insights/leases").content.decode()
    assert 'href="/t/acme/insights/leases/definition?name=uilease&amp;project=docs"' in page
    detail = client.get(f"/t/acme/insights/leases/holders/{holders['acme'].token}").content.decode()
    link = re.search(r'class="def-link" href="([^"]+)"', detail).group(1).replace("&amp;", "&")
    assert link == "/t/acme/insights/leases/definition?name=uilease&project=docs"
    shown = client.get(link)
    assert shown.status_code == 200 and "levels.user" in shown.content.decode()


def test_given_a_revocation_then_its_row_links_to_the_audit_entry_which_other_tenants_cannot_open(world):
    from leases.ops import actions

    users, holders = world
    actions.revoke_holder(holders["acme"].token, tenant_id="acme", acting_user="acme-admin", reason="stuck")
    entry_id = str(store.audit().find_one({"token": holders["acme"].token})["_id"])
    client = logged_in(users["acme-admin"])
    section = revocations_section(client)
    assert f'href="/t/acme/insights/leases/audit/{entry_id}"' in section
    entry = client.get(f"/t/acme/insights/leases/audit/{entry_id}")
    body = entry.content.decode()
    assert entry.status_code == 200 and holders["acme"].token in body and "stuck" in body and "acme-admin" in body
    stranger = logged_in(users["globex-admin"])
    assert stranger.get(f"/t/acme/insights/leases/audit/{entry_id}").status_code == 404
    assert stranger.get(f"/t/globex/insights/leases/audit/{entry_id}").status_code == 404
    assert logged_in(users["acme-member"]).get(f"/t/acme/insights/leases/audit/{entry_id}").status_code == 403
    for bad in ("%24ne", "x" * 24, "0" * 24):
        assert client.get(f"/t/acme/insights/leases/audit/{bad}").status_code == 404


def test_given_the_api_keys_page_then_it_is_a_tab_of_the_tenant_navigation(world):
    users, _ = world
    client = logged_in(users["acme-admin"])
    holders_page = client.get("/t/acme/insights/leases").content.decode()
    assert 'href="/t/acme/insights/api-keys"' in holders_page
    keys_page = client.get("/t/acme/insights/api-keys").content.decode()
    nav = re.search(r'<nav class="tabs">(.*?)</nav>', keys_page, re.S).group(1)
    assert re.search(r'href="/t/acme/insights/api-keys" class="active">API keys', nav)
    assert 'href="/t/acme/insights/leases/waiting"' in nav and 'href="/t/acme/insights/leases"' in nav
