"""The operator CLI ``manage.py lease …``: reads from MongoDB, revocations through a real pod.

The pod is a real ``runserver`` process (tests.live_app); ``--force`` bypasses it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.errors import LeaseLost
from leases.pods import liveness
from leases.revocation import dispatch, handlers
from leases.store import client as store
from leases.store.embedded import free_port
from tests.helpers import PYTHON, REPO, child_env, queue_up, queued_ids, wait_for
from tests.live_app import register_pod, running_app

APP_POD = "cli-test-pod"


class RecordingHandler(handlers.LeaseHandler):
    type = "clitest"

    def __init__(self):
        self.revoked = []

    def on_revoked(self, holder):
        self.revoked.append(holder.token)


@pytest.fixture(autouse=True)
def handler():
    h = handlers.register_handler(RecordingHandler())
    config.put_document("_vance", "_tenant", document_path("clilease"),
                        "resource: clires\nlevels: {global: 9, tenant: 5, user: 3}\nttlSeconds: 60")
    yield h
    handlers.unregister_handler("clitest")


@pytest.fixture(scope="module")
def app(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock(), running_app(APP_POD) as live:
        yield live


@pytest.fixture
def live_pod(app):
    register_pod(app)
    return app


def hold(tenant="acme", user="alice", pod=None, lease="clilease", type_="clitest", project="docs"):
    return leases.acquire(leases.LeaseRequest(type=type_, lease=lease, tenant_id=tenant, project_id=project,
                                              user_id=user, pod=pod, holder_ref=f"ref-{user}"))


def lease(*args):
    out = StringIO()
    call_command("lease", *args, stdout=out)
    return out.getvalue()


# --- reads ----------------------------------------------------------------------------------

def test_list_prints_an_aligned_table_across_tenants_and_filters():
    a = hold()
    g = hold(tenant="globex", user="dave")

    text = lease("list")
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["TOKEN", "TENANT", "PROJECT", "USER", "RESOURCE"]
    assert set(lines[1]) <= {"-", " "}
    # Aligned: every row starts its TENANT column where the header does.
    col = lines[0].index("TENANT")
    rows = [line for line in lines[2:] if line.strip() and not line.startswith(("2 holder",))]
    assert {row[col:].split()[0] for row in rows} == {"acme", "globex"}
    assert a.token in text and g.token in text and "2 holder(s)" in text

    only = json.loads(lease("list", "--tenant", "globex", "--json"))
    assert [item["token"] for item in only["items"]] == [g.token] and only["total"] == 1
    assert json.loads(lease("list", "--type", "clitest", "--resource", "clires", "--pod", "nope", "--json"))["total"] == 0


def test_show_prints_the_holder_and_json_round_trips():
    a = hold()
    a.update_payload({"jobId": "j-1"})
    text = lease("show", "--", a.token)
    assert a.token in text and '"jobId": "j-1"' in text and "clires|user|acme/alice" in text
    data = json.loads(lease("show", "--json", "--", a.token))
    assert data["tenant_id"] == "acme" and data["payload"] == {"jobId": "j-1"}


def test_counters_include_global_with_booked_and_a_drift_marker():
    hold()
    hold(tenant="globex", user="dave")
    store.counters().update_one({"_id": "clires|tenant|acme"}, {"$inc": {"count": 1}})

    text = lease("counters")
    rows = {tuple(line.split()[:3]): line for line in text.splitlines()[2:] if line.strip()}
    assert "DRIFT +1" in rows[("clires", "tenant", "acme")]
    assert rows[("clires", "global", "*")].split()[3:6] == ["2", "9", "2"]
    assert "1 drifted" in text
    drifted = json.loads(lease("counters", "--drift-only", "--json"))
    assert [(c["key"], c["count"], c["booked"], c["drift"]) for c in drifted] == [("clires|tenant|acme", 2, 1, True)]
    assert "global" not in {c["level"] for c in json.loads(lease("counters", "--tenant", "acme", "--json"))}


def test_definition_prints_merged_fields_with_layers():
    config.put_document("acme", "docs", document_path("clilease"), "levels: {user: 1}")
    text = lease("definition", "clilease", "--tenant", "acme", "--project", "docs")
    fields = {line.split()[0]: line.split()[1:] for line in text.splitlines()[3:] if line.strip()}
    assert fields["levels.user"] == ["1", "project"] and fields["resource"] == ["clires", "system"]
    assert fields["levels.project"] == ["no", "cap", "unset"]
    data = json.loads(lease("definition", "clilease", "--tenant", "acme", "--json"))
    assert data["projectId"] == "_tenant" and {f["field"]: f["layer"] for f in data["fields"]}["levels.user"] == "system"


@pytest.mark.parametrize("args,message", [
    (["show", "$ne"], "invalid lease token"),
    (["show", "A" * 32], "HOLDER_NOT_FOUND"),
    (["list", "--tenant", '{"$ne": 1}'], "invalid tenant id"),
    (["list", "--page", "0"], "page must be"),
    (["definition", "../x", "--tenant", "acme"], "invalid lease name"),
    (["revoke", "$gt"], "invalid lease token"),
    (["revoke-pod", "a b", "--force"], "invalid pod id"),
    (["reconcile", "--safety-ms", "-1"], "--safety-ms"),
    (["waiters", "--tenant", '{"$ne": 1}'], "invalid tenant id"),
    (["waiters", "--resource", "$gt"], "invalid resource"),
])
def test_given_bad_input_then_a_clear_error_and_nothing_changes(args, message):
    a = hold()
    with pytest.raises(CommandError, match=message.replace("$", r"\$")):
        lease(*args)
    a.check()


def test_given_bad_input_from_a_shell_then_non_zero_exit_and_one_line_message():
    result = subprocess.run([PYTHON, "manage.py", "lease", "show", "bad$token"], cwd=REPO, env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "CommandError: INVALID_REQUEST: invalid lease token" in result.stderr
    assert result.stdout == ""
    # A token that starts with "-" is a token, not an unknown option.
    dashed = subprocess.run([PYTHON, "manage.py", "lease", "revoke", "-" + "A" * 31, "--force"],
                            cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60)
    assert dashed.returncode == 1 and "CommandError: HOLDER_NOT_FOUND: no holder -AAAA" in dashed.stderr


# --- revocations through a pod ----------------------------------------------------------------

def test_given_no_live_pod_when_revoking_then_error_suggests_force_and_nothing_changes():
    # Runs before the module's app process starts, so no pod can (re-)register meanwhile.
    assert liveness.foreign_endpoints() == []
    held = hold()
    with pytest.raises(CommandError, match="no live pod.*--force"):
        lease("revoke", "--", held.token)
    held.check()


def test_sweep_without_a_live_pod_refuses_and_force_says_no_handler_ran(handler):
    # Runs before the module's app process starts: no pod can (re-)register meanwhile.
    assert liveness.foreign_endpoints() == []
    orphan = hold(user="carol", pod="gone-pod")
    with pytest.raises(CommandError, match="no live pod.*--force to sweep"):
        lease("sweep")
    orphan.check()

    text = lease("sweep", "--force")

    assert "NO handler ran" in text and orphan.token in text and "left to its own expiration" in text
    with pytest.raises(LeaseLost):
        orphan.check()
    assert handler.revoked == [] and "handledBy" not in store.tombstones().find_one({"_id": orphan.token})


def test_given_an_unreachable_endpoint_then_error_and_nothing_changes():
    held = hold()
    with pytest.raises(CommandError, match="no pod reachable"):
        lease("revoke", "--endpoint", f"http://127.0.0.1:{free_port()}", "--", held.token)
    held.check()


def _tombstone_handled_by(token, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = store.tombstones().find_one({"_id": token}) or {}
        if doc.get("handledBy"):
            return doc["handledBy"]
        time.sleep(0.05)
    return None


def test_given_a_live_pod_when_revoking_then_the_pod_revokes_and_runs_the_handler(live_pod):
    # A tex lease of the app's pod: the app's dispatcher runs the tex handler locally.
    held = hold(pod=APP_POD, lease="tex", type_="tex")
    other = hold(user="bob")

    # "--": tokens may start with "-" (the shell entry point moves them itself, see below).
    text = lease("revoke", "--reason", "stuck compile", "--", held.token)

    assert held.token in text and f"via pod {APP_POD}" in text and "handlers dispatched and finished" in text
    with pytest.raises(LeaseLost):
        held.check()
    assert _tombstone_handled_by(held.token) == APP_POD
    audit = store.audit().find_one({"token": held.token})
    assert audit["actor"].startswith("internal-admin:cli:") and audit["reason"] == "stuck compile"
    other.check()
    with pytest.raises(CommandError, match="HOLDER_NOT_FOUND"):
        lease("revoke", "--", held.token)


def test_given_a_live_pod_when_revoking_a_pod_then_all_its_holders_go(live_pod):
    victims = [hold(pod="dead-pod-1"), hold(tenant="globex", user="dave", pod="dead-pod-1")]
    survivor = hold(user="bob", pod="dead-pod-2")

    data = json.loads(lease("revoke-pod", "dead-pod-1", "--json"))

    assert {h["token"] for h in data["revoked"]} == {v.token for v in victims} and data["handlersRan"] is True
    for v in victims:
        with pytest.raises(LeaseLost):
            v.check()
    survivor.check()


def test_given_a_wrong_shared_secret_then_the_pod_refuses(live_pod, settings):
    held = hold()
    settings.LEASES_INTERNAL_SECRET = "not-the-pods-secret"
    with pytest.raises(CommandError, match="refused the shared secret"):
        lease("revoke", "--", held.token)
    held.check()


def test_given_force_then_revoked_in_mongodb_without_handler_and_output_says_so(handler):
    held = hold(lease="browser", type_="browser", pod="")
    held.update_payload({"tool": "browser", "endpoint": "http://127.0.0.1:9/mcp", "sessionId": "s-1"})

    text = lease("revoke", "--force", "--", held.token)

    assert "NO handler ran" in text and "left to its own expiration" in text and "s-1" in text
    with pytest.raises(LeaseLost):
        held.check()
    assert dispatch.get_dispatcher().drain(timeout=5)
    assert "handledBy" not in store.tombstones().find_one({"_id": held.token})
    assert store.audit().find_one({"token": held.token})["handlerDispatched"] is False


def test_given_force_for_a_pod_then_json_says_no_handler_ran():
    held = hold(pod="gone-pod")
    data = json.loads(lease("revoke-pod", "gone-pod", "--force", "--json"))
    assert data["handlersRan"] is False and [h["token"] for h in data["revoked"]] == [held.token]
    assert "NO handler ran" in data["note"]


# --- sweep and reconcile ------------------------------------------------------------------------

def test_sweep_runs_on_a_live_pod_and_says_where_each_handler_ran_and_which_ran_nowhere(live_pod, handler):
    # Given: an idle tex holder of the app's pod, a busy detached holder, and a holder of a
    # dead pod whose type ("clitest") only this test process registers, not the app.
    idle = hold(pod=APP_POD, lease="tex", type_="tex")
    store.holders().update_one({"_id": idle.token}, {"$set": {"expiresAt": store.server_now() - timedelta(seconds=1)}})
    busy = hold(user="bob", pod="")
    orphan = hold(user="carol", pod="gone-pod")

    # When
    text = lease("sweep")

    # Then: the app's pod ran the round; its own tex handler ran there; nothing could run
    # the clitest handler, and the output says so instead of passing for done.
    assert f"Sweep via pod {APP_POD}: 2 holder(s) reaped" in text
    assert _tombstone_handled_by(idle.token) == APP_POD
    [idle_row] = [line for line in text.splitlines() if line.startswith(idle.token)]
    assert idle_row.split()[-2:] == ["local", APP_POD]
    assert f"NO handler ran for {orphan.token} (clitest): no live pod has a handler for this type" in text
    assert handler.revoked == []  # the test process is no pod: the round never ran here
    for gone in (idle, orphan):
        with pytest.raises(LeaseLost):
            gone.check()
    busy.check()
    data = json.loads(lease("sweep", "--json"))
    assert data["via"] == f"pod {APP_POD}" and data["holders"] == [] and data["dispatchSettled"] is True


def test_reconcile_corrects_drift_without_a_pod():
    hold()
    now = store.server_now()
    store.counters().update_one({"_id": "clires|tenant|acme"},
                                {"$inc": {"count": 2}, "$set": {"updatedAt": now - timedelta(minutes=5)}})

    text = lease("reconcile")

    assert "Reconcile: 1 counter(s)" in text
    assert store.counters().find_one({"_id": "clires|tenant|acme"})["count"] == 1
    assert lease("counters", "--drift-only").strip() == "No drift."


# --- errors say what was not found; --json errors are JSON ------------------------------------

def lease_fails(*args):
    """Run a failing command; returns (CommandError message, stdout)."""
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("lease", *args, stdout=out)
    return str(raised.value), out.getvalue()


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_given_an_unknown_pod_when_revoking_it_then_pod_not_found_and_nothing_changes(json_flag):
    held = hold(pod="real-pod")
    for force in ([], ["--force"]):
        message, out = lease_fails("revoke-pod", "nosuchpod", *force, *json_flag)
        assert message.startswith("POD_NOT_FOUND") and "nosuchpod" in message
        assert "Nothing to revoke" not in out
    held.check()


def test_given_an_unknown_pod_from_a_shell_then_exit_1_and_the_pod_is_named():
    result = subprocess.run([PYTHON, "manage.py", "lease", "revoke-pod", "nosuchpod"], cwd=REPO, env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "POD_NOT_FOUND: unknown pod 'nosuchpod'" in result.stderr


def test_given_an_unknown_tenant_or_project_when_showing_a_definition_then_it_says_what_was_not_found():
    from insights.models import Project, Tenant

    message, out = lease_fails("definition", "tex", "--tenant", "nosuchtenant")
    assert message.startswith("TENANT_NOT_FOUND") and "nosuchtenant" in message and out == ""
    Project.objects.create(tenant=Tenant.objects.create(slug="acme", name="Acme"), slug="docs")
    message, _ = lease_fails("definition", "tex", "--tenant", "acme", "--project", "nosuch")
    assert message.startswith("PROJECT_NOT_FOUND") and "nosuch" in message
    assert "ttlSeconds" in lease("definition", "tex", "--tenant", "acme", "--project", "docs")
    assert "_vance/_tenant" in lease("definition", "tex", "--tenant", "_vance")  # the System layer itself
    assert "not defined in any layer" in lease("definition", "nosuchlease", "--tenant", "acme")


def test_given_only_a_tenant_document_when_showing_it_tenant_wide_then_ttl_comes_from_the_tenant_layer():
    config.put_document("acme", "_tenant", document_path("browser"), "ttlSeconds: 45")
    data = json.loads(lease("definition", "browser", "--tenant", "acme", "--json"))
    assert {f["field"]: (f["value"], f["layer"]) for f in data["fields"]}["ttlSeconds"] == (45, "tenant")


@pytest.mark.parametrize("args, code", [
    (["show", "A" * 32, "--json"], "HOLDER_NOT_FOUND"),
    (["list", "--tenant", "$ne", "--json"], "INVALID_REQUEST"),
    (["revoke-pod", "nosuchpod", "--json"], "POD_NOT_FOUND"),
    (["definition", "tex", "--tenant", "nosuchtenant", "--json"], "TENANT_NOT_FOUND"),
    (["reconcile", "--safety-ms", "-1", "--json"], "INVALID_REQUEST"),
    (["revoke", "--endpoint", "ftp://x", "--json", "--", "A" * 32], "INVALID_REQUEST"),
])
def test_given_json_output_when_a_command_fails_then_the_error_is_a_json_object(args, code):
    message, out = lease_fails(*args)
    error = json.loads(out)["error"]
    assert error["code"] == code and error["message"] and message.startswith(code)


def test_given_json_output_from_a_shell_when_failing_then_stdout_is_the_json_error_and_exit_is_1():
    result = subprocess.run([PYTHON, "manage.py", "lease", "show", "A" * 32, "--json"], cwd=REPO, env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr == ""
    assert json.loads(result.stdout) == {"error": {"code": "HOLDER_NOT_FOUND", "message": f"no holder {'A' * 32}"}}


def test_given_force_on_a_detached_pod_bound_holder_then_it_says_detached_and_no_handler():
    held = leases.acquire(leases.LeaseRequest(type="clitest", lease="clilease", tenant_id="acme", project_id="docs",
                                              user_id="alice", pod="", pod_bound=True))
    text = lease("revoke", "--force", "--", held.token)
    assert "is detached (no pod" in text and "no pod runs its handler" in text and "NO handler ran" in text
    assert "(none)" not in text and "keeps running there" not in text


# --- waiters --------------------------------------------------------------------------------

def wait_request(tenant, user):
    return leases.LeaseRequest(type="clitest", lease="cliwait", tenant_id=tenant, project_id="docs", user_id=user,
                               pod="", wait_ms=30_000)


def until_queued(before, key="cliwres|global|*"):
    new = wait_for(lambda: set(queued_ids(key)) - before, 20, step=0.01)
    assert new, "the waiter never queued"
    (ticket,) = new
    return ticket


WAIT_CHILD = """
import django; django.setup()
import leases
from leases.revocation import handlers
class Q(handlers.LeaseHandler):
    type = "clitest"
    def on_revoked(self, holder): pass
handlers.register_handler(Q())
print("ready", flush=True)
leases.acquire(leases.LeaseRequest(type="clitest", lease="cliwait2", tenant_id="initech", project_id="ops",
                                   user_id="ghost", pod="", wait_ms=60000))
"""


def test_waiters_lists_every_tenants_tickets_with_position_blocking_level_and_marks_stale_ones(settings):
    # This process's waiters stay fresh for 30 s (a late keep-alive cannot reorder them);
    # the child's ticket lives 400 ms, so it goes stale soon after the child is killed.
    settings.LEASES_TICKET_TTL_MS = 30_000
    for name, resource in (("cliwait", "cliwres"), ("cliwait2", "cliwres2")):
        config.put_document("_vance", "_tenant", document_path(name),
                            f"resource: {resource}\nlevels: {{global: 1, user: 1}}\nttlSeconds: 60\nwaitMs: 30000")
    held = hold(tenant="globex", user="gina", lease="cliwait")
    held2 = hold(tenant="globex", user="gina", lease="cliwait2")
    # Given a waiter killed with SIGKILL (its ticket goes stale after its short TTL; it waits
    # on a resource nobody else waits for, so no live waiter prunes it before it is listed) ...
    child = subprocess.Popen([PYTHON, "-c", WAIT_CHILD], cwd=REPO, env=child_env(LEASES_TICKET_TTL_MS="400"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    waiters = []
    try:
        assert child.stdout.readline().strip() == "ready"
        dead = until_queued(set(), "cliwres2|global|*")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        # ... and two live waiters of acme, blocked by the global level ...
        for user in ("alice", "bob"):
            waiters.append(queue_up(wait_request("acme", user), "cliwres|global|*"))
        deadline = time.monotonic() + 10
        while not json.loads(lease("waiters", "--json"))["items"][-1]["stale"]:
            assert time.monotonic() < deadline, "the dead ticket never went stale"
            time.sleep(0.05)
        # When the operator lists the waiters
        data = json.loads(lease("waiters", "--json"))
        text = lease("waiters")
        only_acme = json.loads(lease("waiters", "--tenant", "acme", "--resource", "cliwres", "--json"))
        nothing = lease("waiters", "--resource", "nosuchres")
    finally:
        if child.poll() is None:
            child.kill()
        held.release()
        held2.release()
        for waiter in waiters:
            waiter.join(30)
            if waiter.lease is not None:
                waiter.lease.release()
    # Then: every tenant's tickets, live ones by place, the stale one last and marked.
    rows = [(w["tenant_id"], w["user_id"], w["position"], w["level"], w["stale"]) for w in data["items"]]
    assert rows == [("acme", "alice", 1, "global", False), ("acme", "bob", 2, "global", False),
                    ("initech", "ghost", None, "global", True)]
    assert data["items"][-1]["ticket_id"] == dead
    assert [(w["blocked_key"], w["blocked_count"], w["blocked_cap"]) for w in data["items"]] == [
        ("cliwres|global|*", 1, 1), ("cliwres|global|*", 1, 1), ("cliwres2|global|*", 1, 1)]
    lines = text.splitlines()
    assert lines[0].split() == ["RESOURCE", "TENANT", "PROJECT", "USER", "POS", "WAITING-SINCE", "WAITED",
                                "CLASS", "EST-GRANT-IN", "BLOCKED-AT", "STALE", "TICKET"]
    ghost = next(line for line in lines if "ghost" in line)
    assert "STALE" in ghost and "global 1/1" in ghost and dead in ghost
    assert "3 waiting ticket(s), 1 stale" in text
    assert [w["ticket_id"] for w in only_acme["items"]] == [w.ticket for w in waiters]
    assert nothing.strip() == "No waiting tickets."


def test_waiters_with_json_and_bad_input_prints_the_json_error_object():
    with pytest.raises(CommandError):
        out = StringIO()
        try:
            call_command("lease", "waiters", "--tenant", "a/b", "--json", stdout=out)
        finally:
            error = json.loads(out.getvalue())["error"]
    assert error["code"] == "INVALID_REQUEST" and "tenant id" in error["message"]
