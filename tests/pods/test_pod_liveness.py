"""The one definition of "pod alive": deadline on server time, stopped, own pod; the endpoint is reachability."""

from __future__ import annotations

from datetime import timedelta

import pytest

from leases.pods import leases as pod_leases, liveness as pod_liveness
from leases.pods.leases import Outcome
from leases.pods.liveness import LeasePodLiveness
from tests.helpers import stored_pod

pytestmark = pytest.mark.usefixtures("pod_settings")


def test_given_pod_deadline_when_judging_liveness_then_dead_exactly_at_the_deadline_and_not_before():
    pod_leases.register("pod-x", "http://x:1", proposed_interval=2)
    deadline = stored_pod("pod-x")["expiryDeadline"]
    view = LeasePodLiveness(self_pod="someone-else")
    assert view.is_alive("pod-x", now=deadline - timedelta(milliseconds=1))
    assert not view.is_alive("pod-x", now=deadline)
    assert not view.is_alive("pod-x", now=deadline + timedelta(milliseconds=1))
    assert view.endpoint("pod-x", now=deadline - timedelta(milliseconds=1)) == "http://x:1"
    assert view.endpoint("pod-x", now=deadline) is None


def test_given_pods_stopped_or_unregistered_then_dead_but_own_pod_always_alive():
    view = LeasePodLiveness(self_pod="me")
    stopping = pod_leases.register("stopping", "http://x:1")
    assert pod_leases.stop("stopping", stopping.lease_id)
    assert not view.is_alive("stopping")
    assert not view.is_alive("ghost")
    assert not view.is_alive("")  # detached: no pod at all
    assert view.is_alive("me")  # never registered, still alive: it is doing the check
    assert pod_leases.renew("stopping", stopping.lease_id).outcome is Outcome.STALE_LEASE


def test_given_a_renewing_pod_without_endpoint_then_alive_for_reaping_but_unreachable():
    # A script or a shell serves no endpoint: its leases must not be reaped as a dead pod's.
    view = LeasePodLiveness(self_pod="me")
    pod_leases.register("no-endpoint", "", proposed_interval=2)
    assert view.is_alive("no-endpoint")
    assert view.endpoint("no-endpoint") == ""  # alive, nothing to POST to
    assert "no-endpoint" in view.alive_pods()
    deadline = stored_pod("no-endpoint")["expiryDeadline"]
    assert not view.is_alive("no-endpoint", now=deadline)  # the deadline still decides


def test_given_registered_pods_when_viewing_then_each_row_carries_liveness():
    pod_leases.register("pod-v1", "http://x:1")
    pod_leases.register("pod-v2", "")
    rows = {row["podId"]: row for row in pod_liveness.pod_view()}
    assert rows["pod-v1"]["alive"] is True and rows["pod-v2"]["alive"] is True  # no endpoint: still alive
    assert [pod for pod, _ in pod_liveness.foreign_endpoints()] == ["pod-v1"]  # but not one to call
