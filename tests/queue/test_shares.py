"""Shares and classes end to end: weights and classes resolved into tickets, the pass
charged by the grant, a refused class, estimates; real OS processes in a weighted queue and
a priority queue (holders are never revoked for priority)."""

from __future__ import annotations

import re
import subprocess
import time
from functools import partial

import pytest

import leases
from leases.definitions import model as definitions
from leases.errors import InvalidLeaseRequest, PriorityNotAllowed
from leases.queue import estimates, order, shares
from leases.store import client as store
from tests import helpers
from tests.helpers import PYTHON, REPO, child_env, define, lease_request, quiet_handler_fixture, wait_for

GATE = "res|global|*"


handler = quiet_handler_fixture("test")


put = partial(define, "res")
req = partial(lease_request, pod="")


def gate_doc():
    return store.counters().find_one({"_id": GATE}) or {}


CLASSES = ("levels: {global: 1}\nwaitMs: 30000\npriorities: [interactive, batch]\n"
           "allowedPriorities: {globex: [batch]}\nmaxStarvationMs: 60000\n"
           "shares: {tenants: {acme: 3}, projects: {p2: 2}}\n")


def test_given_weights_and_classes_when_a_request_queues_then_its_ticket_carries_them():
    put(CLASSES)
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(project="p2", priority="interactive"), GATE)
    ticket = gate_doc()["queue"][0]
    assert (ticket["wt"], ticket["wp"], ticket["pc"], ticket["pn"], ticket["ms"]) == (3, 2, 0, "interactive", 60000)
    held.release()
    waiter.join(10)
    assert waiter.lease is not None
    # The grant charged its tenant's and project's pass in the booking update.
    vt = gate_doc()["vt"]
    assert vt["acme"] == pytest.approx(1 / 3) and vt["acme/p2"] == pytest.approx(1 / 2)
    waiter.lease.release()
    assert gate_doc()["holds"]  # the hold durations feed the estimates


def test_given_no_priority_then_the_default_class_is_the_lowest():
    put(CLASSES)
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(user="w"), GATE)
    assert gate_doc()["queue"][0]["pn"] == "batch"
    held.release()
    waiter.join(10)
    waiter.lease.release()


@pytest.mark.parametrize("tenant, priority, error", [
    ("globex", "interactive", PriorityNotAllowed),
    ("acme", "urgent", InvalidLeaseRequest),
    ("acme", "Not A Class", InvalidLeaseRequest),
])
def test_given_a_class_the_tenant_may_not_use_or_unknown_then_it_is_refused_and_nothing_is_written(
        tenant, priority, error):
    put(CLASSES)
    before = store.holders().count_documents({})
    with pytest.raises(error) as raised:
        leases.acquire(req(tenant=tenant, priority=priority))
    assert type(raised.value) is error
    assert store.holders().count_documents({}) == before
    assert not store.counters().find_one({"_id": GATE, "count": {"$gt": 0}})


@pytest.mark.parametrize("tenant, priority, error", [
    ("acme", "urgent", InvalidLeaseRequest),
    ("globex", "interactive", PriorityNotAllowed),
])
def test_given_an_uncapped_lease_when_a_bad_class_is_named_then_it_is_refused_as_on_a_capped_one(
        tenant, priority, error):
    uncapped = "\n".join(line for line in CLASSES.splitlines() if not line.startswith("levels"))
    put(uncapped)
    assert leases.acquire(req(tenant=tenant)) is leases.NOOP  # the default class: nothing to refuse
    with pytest.raises(error):
        leases.acquire(req(tenant=tenant, priority=priority))


def test_given_a_lease_without_classes_when_a_priority_is_named_then_invalid_request():
    put("levels: {global: 1}")
    with pytest.raises(InvalidLeaseRequest, match="defines no priority classes"):
        leases.acquire(req(priority="batch"))


def test_given_the_gate_has_hold_history_when_a_request_times_out_then_busy_carries_the_estimate():
    put("levels: {global: 1}\nwaitMs: 300")
    held = leases.acquire(req(user="h"))
    store.counters().update_one({"_id": GATE}, {"$set": {"holds": [1000.0, 1000.0, 1000.0]}})
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(user="w"))
    # First in line behind one holder of cap 1: half the typical hold.
    assert busy.value.retry_after == pytest.approx(0.5, abs=0.01)
    held.release()


def test_given_an_estimate_then_it_counts_the_tickets_ahead_and_those_the_rule_lets_pass_later():
    gate = {"cap": 2, "holders": ["a/p/u/h1", "b/p/u/h2"], "holds": [100, 200, 300],
            "queue": [{"id": f"q{i}", "t": "a", "p": "p", "u": "u", "at": store.server_now(), "ttl": 60000}
                      for i in range(3)]}
    now = gate["queue"][0]["at"]
    # Typical hold 200 ms, cap 2: a slot frees every 100 ms. q0 takes the first; then b's
    # holder asks again and, holding less than a, takes every other slot: q1 and q2 are
    # granted three and five releases from now.
    assert [estimates.wait_ms(gate, f"q{i}", now) for i in range(3)] == [50.0, 250.0, 450.0]
    assert estimates.releases_until(gate, "q2", now) == 5
    assert estimates.wait_ms({**gate, "holds": []}, "q0", now) is None
    assert estimates.wait_ms(gate, "nope", now) is None


def test_given_project_weights_set_by_the_tenant_admin_then_the_layer_is_rewritten_and_audited():
    put("levels: {global: 2}")
    weights = shares.set_project_weight("acme", "res", "p2", 2, acting_user="alice")
    assert weights == {"p2": 2}
    definition = definitions.load("res", "acme", "p2")
    assert definition.project_weight("p2") == 2 and definition.sources.get("shares.projects") == "tenant"
    record = store.audit().find_one({"action": "project-weight", "tenantId": "acme"})
    assert (record["actor"], record["key"], record["after"], record["before"]) == ("alice", "p2", 2, None)
    with pytest.raises(InvalidLeaseRequest):
        shares.set_project_weight("acme", "res", "p2", -1, acting_user="alice")
    assert definitions.load("res", "acme", "p2").project_weight("p2") == 2  # unchanged


def test_given_tenant_weights_set_by_the_operator_then_they_are_listed_and_applied():
    put("levels: {global: 2}")
    shares.set_tenant_weight("res", "acme", 3, acting_user="ops")
    shares.set_tenant_weight("res", "globex", 0.5, acting_user="ops")
    assert shares.tenant_weights() == [{"lease": "res", "tenant": "acme", "weight": 3},
                                       {"lease": "res", "tenant": "globex", "weight": 0.5}]
    assert definitions.load("res", "acme", "p1").tenant_weight("acme") == 3
    shares.set_tenant_weight("res", "globex", None, acting_user="ops")
    assert [r["tenant"] for r in shares.tenant_weights()] == ["acme"]


# --- real processes ------------------------------------------------------------------------

CHILD = """
import sys, time
import django; django.setup()
import leases
from leases.revocation import handlers
class Q(handlers.LeaseHandler):
    type = "test"
    def on_revoked(self, holder): pass
handlers.register_handler(Q())
tenant, project, name, priority = sys.argv[1:5]
print("ready", flush=True)
sys.stdin.readline()  # the test says when: arrivals in a fixed order
lease = leases.acquire(leases.LeaseRequest(type="test", lease="res", tenant_id=tenant, project_id=project,
                                           user_id=name, pod="", priority=priority or None))
print("granted", name, time.time(), flush=True)
time.sleep(0.15)
lease.release()
"""


def spawn_in_order(specs):
    """One child process per (tenant, project, name, priority), all started at once (their
    Django set-ups overlap), each told to ask once the one before has its ticket in the queue
    (so the arrival order is fixed)."""
    children = [subprocess.Popen([PYTHON, "-c", CHILD, tenant, project, name, priority or ""], cwd=REPO,
                                 env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for tenant, project, name, priority in specs]
    try:
        for child in children:
            before = len(helpers.queued_ids(GATE))
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            child.stdin.write("go\n")
            child.stdin.flush()
            assert wait_for(lambda before=before: len(helpers.queued_ids(GATE)) > before, 30, 0.02), (
                "child did not queue")
    except BaseException:
        for child in children:  # the ones after a failed one are running too now
            child.kill()
            child.wait()
        raise
    return children


def grant_order(children):
    grants = []
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        _, name, at = next(line for line in out.splitlines() if line.startswith("granted")).split()
        grants.append((float(at), name))
    return [name for _, name in sorted(grants)]


def test_given_real_processes_of_tenants_weighted_3_to_1_then_grants_follow_the_weights():
    # Given: cap 1 held; a1, b1, a2, b2, a3, b3, a4, b4 queue in that order, acme weighs 3.
    put("levels: {global: 1}\nwaitMs: 60000\nshares: {tenants: {acme: 3, bravo: 1}}")
    held = leases.acquire(req(tenant="zulu", user="h"))
    specs = [(tenant, "p1", f"{tenant[0]}{i}", None) for i in range(1, 5) for tenant in ("acme", "bravo")]
    children = spawn_in_order(specs)
    try:
        # When: the slot turns over from process to process.
        held.release()
        order_seen = grant_order(children)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    # Then: passes (grants ÷ weight) decide, ties go to the older ticket: a gets three
    # turns for each of b's while both wait.
    assert order_seen == ["a1", "b1", "a2", "a3", "b2", "a4", "b3", "b4"]


def test_given_real_processes_when_an_interactive_request_queues_behind_batch_then_it_goes_first_and_no_holder_is_revoked():
    put("levels: {global: 1}\nwaitMs: 60000\npriorities: [interactive, batch]")
    held = leases.acquire(req(tenant="zulu", user="h", priority="batch"))
    specs = [("acme", "p1", "batch1", "batch"), ("bravo", "p1", "batch2", "batch"),
             ("acme", "p1", "batch3", None), ("bravo", "p1", "inter", "interactive")]
    children = spawn_in_order(specs)
    try:
        assert order.ranked(gate_doc(), store.server_now())[0]["pn"] == "interactive"
        time.sleep(0.3)
        # The batch holder keeps its slot: priority reorders the queue, never the holders.
        held.check()
        assert store.holders().find_one({"_id": held.token})["state"] == "HELD"
        held.release()
        order_seen = grant_order(children)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    assert order_seen == ["inter", "batch1", "batch2", "batch3"]


def test_given_the_operator_cli_when_setting_and_listing_tenant_weights_then_applied_and_audited():
    import io
    import json

    from django.core.management import CommandError, call_command

    put("levels: {global: 2}")
    out = io.StringIO()
    call_command("lease", "set-weight", "res", "acme", "3", stdout=out)
    assert "acme now weighs 3 on lease res" in out.getvalue()
    out = io.StringIO()
    call_command("lease", "weights", "--json", stdout=out)
    assert json.loads(out.getvalue()) == [{"lease": "res", "tenant": "acme", "weight": 3}]
    out = io.StringIO()
    call_command("lease", "weights", stdout=out)
    assert re.search(r"res\s+acme\s+3", out.getvalue())
    assert definitions.load("res", "acme", "p1").tenant_weight("acme") == 3
    assert store.audit().find_one({"action": "tenant-weight", "tenantId": "acme"})["actor"].startswith("cli:")
    with pytest.raises(CommandError, match="INVALID_REQUEST"):
        call_command("lease", "set-weight", "res", "acme", "-2")
    with pytest.raises(CommandError, match="INVALID_REQUEST"):
        call_command("lease", "set-weight", "res", "$ne", "2")
    assert definitions.load("res", "acme", "p1").tenant_weight("acme") == 3
    call_command("lease", "set-weight", "res", "acme", "default", stdout=io.StringIO())
    assert definitions.load("res", "acme", "p1").tenant_weight("acme") == 1


def test_given_waiting_tickets_then_lease_waiters_shows_class_and_estimated_grant():
    import io
    import json

    from django.core.management import call_command

    put(CLASSES)
    leases.acquire(req(user="warm")).release()  # one hold on record
    held = leases.acquire(req(user="h"))
    waiter = helpers.queue_up(req(user="w", priority="interactive"), GATE)
    try:
        out = io.StringIO()
        call_command("lease", "waiters", stdout=out)
        text = out.getvalue()
        assert "CLASS" in text and "EST-GRANT-IN" in text
        row = next(line for line in text.splitlines() if waiter.ticket in line)
        assert "interactive" in row and re.search(r"\d+\.\ds", row), row
        out = io.StringIO()
        call_command("lease", "waiters", "--json", stdout=out)
        item = json.loads(out.getvalue())["items"][0]
        assert item["priority"] == "interactive" and item["estimated_grant_at"] is not None
    finally:
        held.release()
        waiter.join(10)
        if waiter.lease is not None:
            waiter.lease.release()
