"""This process's pod: the renewal thread, its retry rule, and the once-per-process start."""

from __future__ import annotations

import time
from datetime import timedelta

import pymongo
import pytest

from leases.pods.leases import Outcome
from leases.pods.renewer import PodRenewer
from leases.store import client as store
from tests.helpers import stored_pod

pytestmark = pytest.mark.usefixtures("pod_settings")


def test_given_renewer_thread_when_idle_then_it_renews_on_its_own_at_the_server_interval(settings):
    settings.LEASES_POD_INTERVAL_MIN = 1
    renewer = PodRenewer("pod-thread", "http://x:1", proposed_interval=1).start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (stored_pod("pod-thread") is None):
            time.sleep(0.05)
        first = stored_pod("pod-thread")["lastReceiptAt"]
        while time.monotonic() < deadline and stored_pod("pod-thread")["lastReceiptAt"] == first:
            time.sleep(0.1)
        assert stored_pod("pod-thread")["lastReceiptAt"] > first
        assert renewer.lease.outcome in (Outcome.GRANTED, Outcome.RENEWED)
    finally:
        renewer.shutdown()
    assert stored_pod("pod-thread")["stopped"] is True


def test_given_expired_lease_when_renewer_steps_then_it_reregisters():
    renewer = PodRenewer("pod-step", "http://x:1", proposed_interval=2)
    renewer.step()
    old = renewer.lease.lease_id
    store.pods().update_one({"_id": "pod-step"}, {"$set": {"expiryDeadline": store.server_now() - timedelta(seconds=1)}})
    renewer.step()
    assert renewer.lease.outcome is Outcome.GRANTED and renewer.lease.lease_id != old


def test_given_store_unreachable_when_renewer_steps_then_retry_within_the_interval_with_bounded_jitter():
    from leases.store.embedded import free_port

    renewer = PodRenewer("pod-fail", "http://x:1", proposed_interval=4)
    renewer.step()
    dead_client = pymongo.MongoClient(f"mongodb://127.0.0.1:{free_port()}/?directConnection=true",
                                      serverSelectionTimeoutMS=100, connectTimeoutMS=100, timeoutMS=200)
    store.set_client(dead_client)
    try:
        delays = [renewer.step() for _ in range(3)]
    finally:
        store.set_client(None)
        dead_client.close()
    assert renewer.failures == 3
    assert all(2.0 <= d <= 3.0 for d in delays), delays  # interval 4: 0.5·i + U(0, 0.25·i)
    assert renewer.lease.outcome is Outcome.GRANTED  # the last good answer is kept
