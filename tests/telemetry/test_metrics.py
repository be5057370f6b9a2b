"""Metric labels come from defined resources only; outcomes carry the real resource."""

from __future__ import annotations

import json
import subprocess
import time
from functools import partial

import pytest
from prometheus_client import REGISTRY

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.telemetry import metrics
from tests.helpers import PYTHON, REPO, child_env, lease_request, quiet_handler_fixture

handler = quiet_handler_fixture("test")


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


req = partial(lease_request, pod="")


def label_values(metric, label):
    return {s.labels.get(label) for m in REGISTRY.collect() if m.name == metric for s in m.samples}


def test_given_made_up_lease_names_then_noop_acquisitions_share_one_fixed_label():
    before = sample("vance_lease_acquire_total", resource="undefined", outcome="noop")
    for name in ("rnd-a1", "rnd-b2", "rnd-c3"):
        assert leases.acquire(req(name)) is leases.NOOP
    assert sample("vance_lease_acquire_total", resource="undefined", outcome="noop") == before + 3
    assert not {"rnd-a1", "rnd-b2", "rnd-c3"} & label_values("vance_lease_acquire", "resource")


def test_given_a_defined_lease_then_lost_checks_and_repeated_releases_carry_its_resource():
    config.put_document("_vance", "_tenant", document_path("metered"), "resource: meter-r\nlevels: {global: 2}")
    lease = leases.acquire(req("metered"))
    lost_before = sample("vance_lease_check_total", resource="meter-r", outcome="lost")
    again_before = sample("vance_lease_release_total", resource="meter-r", outcome="already-released")
    assert lease.release() is True
    assert lease.release() is False
    with pytest.raises(leases.LeaseLost):
        lease.check()
    assert sample("vance_lease_check_total", resource="meter-r", outcome="lost") == lost_before + 1
    assert sample("vance_lease_release_total", resource="meter-r", outcome="already-released") == again_before + 1


def test_given_a_queued_acquire_then_wait_metrics_are_labelled_by_resource():
    config.put_document("_vance", "_tenant", document_path("metered"), "resource: meter-w\nlevels: {global: 1}\nwaitMs: 200")
    held = leases.acquire(req("metered"))
    timeouts = sample("vance_lease_wait_total", resource="meter-w", outcome="timeout")
    with pytest.raises(leases.LeaseBusy):
        leases.acquire(req("metered", user="u2"))
    assert sample("vance_lease_wait_total", resource="meter-w", outcome="timeout") == timeouts + 1
    assert sample("vance_lease_wait_seconds_count", resource="meter-w") >= 1
    assert sample("vance_lease_waiting", resource="meter-w") == 0
    held.release()


def test_given_a_kept_ticket_granted_on_a_later_poll_then_its_class_wait_is_recorded_once_up_to_the_grant():
    from leases import service
    from leases.engine import holders

    config.put_document("_vance", "_tenant", document_path("metered"),
                        "resource: meter-t\nlevels: {global: 1}\nwaitMs: 10000")
    labels = {"resource": "meter-t", "priority": "none"}
    held = leases.acquire(req("metered"))
    count = sample("vance_lease_wait_by_class_seconds_count", **labels)
    total = sample("vance_lease_wait_by_class_seconds_sum", **labels)
    ticket = service.acquire_or_ticket(req("metered", user="u2", wait_ms=50), keep_ms=30000)
    assert isinstance(ticket, service.Ticket)
    # Kept, not granted: its wait has not ended.
    assert sample("vance_lease_wait_by_class_seconds_count", **labels) == count
    time.sleep(0.5)
    held.release()
    scope = holders.scope("acme", "p1")
    lease = service.resume(ticket.id, scope=scope, keep_ms=30000)
    assert isinstance(lease, service.Lease)
    assert sample("vance_lease_wait_by_class_seconds_count", **labels) == count + 1
    waited = sample("vance_lease_wait_by_class_seconds_sum", **labels) - total
    # From the ticket's arrival to the grant on the server's clock: the half second it sat
    # kept counts, not only the 50 ms until it was kept.
    assert 0.5 <= waited < 10
    assert isinstance(service.resume(ticket.id, scope=scope, keep_ms=30000), service.Lease)  # answered again
    assert sample("vance_lease_wait_by_class_seconds_count", **labels) == count + 1
    lease.release()


LEASE_FAMILIES = """
import json, django
django.setup()
from prometheus_client import REGISTRY
print(json.dumps(sorted(m.name for m in REGISTRY.collect() if "_lease_" in m.name)))
"""


def run_child(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", code], cwd=REPO, env=child_env(DJANGO_LOG_LEVEL="WARNING", **env),
                          capture_output=True, text=True, timeout=120)


def test_given_no_namespace_setting_then_every_lease_series_keeps_the_platforms_vance_name():
    assert metrics.NAMESPACE == "vance" and metrics.PREFIX == "vance_lease_"
    assert {"vance_lease_acquire", "vance_lease_reap", "vance_lease_waiting", "vance_lease_wait_by_class_seconds"} \
        <= {m.name for m in REGISTRY.collect()}


def test_given_a_host_namespace_then_every_lease_series_is_named_by_it_and_none_by_vance():
    child = run_child(LEASE_FAMILIES, LEASES_METRICS_NAMESPACE="acme_ops")
    assert child.returncode == 0, child.stderr[-3000:]
    names = json.loads(child.stdout.strip().splitlines()[-1])
    assert "acme_ops_lease_acquire" in names and "acme_ops_lease_wait_by_class_seconds" in names
    assert names == sorted(n.replace("vance_", "acme_ops_", 1) for n in _vance_lease_families())


@pytest.mark.parametrize("bad", ["9lives", "acme-ops", "acme ops", "acme:ops"])
def test_given_a_namespace_that_cannot_start_a_metric_name_then_the_process_starts_says_so_and_keeps_vance(bad):
    # A traceback at import would also end `manage.py check` before it could name the
    # setting (leases.E014, tests/test_checks.py): the process starts, logs the error and
    # keeps the default names, which the check then reports.
    child = run_child(LEASE_FAMILIES, LEASES_METRICS_NAMESPACE=bad)
    assert child.returncode == 0, child.stderr[-3000:]
    assert "LEASES_METRICS_NAMESPACE" in child.stderr and "Traceback" not in child.stderr, child.stderr[-3000:]
    names = json.loads(child.stdout.strip().splitlines()[-1])
    assert names == _vance_lease_families()


def _vance_lease_families() -> list[str]:
    return sorted(m.name for m in REGISTRY.collect() if m.name.startswith("vance_lease_"))
