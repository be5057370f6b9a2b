"""Pod leases: server-issued registration leases in ``lease_pods`` and their renewal rules.

All deadline arithmetic is checked on stored server dates; no test depends on the test
process's clock.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from datetime import datetime, timedelta

import pytest

from leases.pods import leases as pod_leases
from leases.pods.leases import Outcome, PodLeaseError
from leases.pods.liveness import liveness
from leases.store import client as store
from tests.helpers import PYTHON, REPO, child_env, stored_pod

pytestmark = pytest.mark.usefixtures("pod_settings")


def test_given_new_pod_when_registering_then_server_grants_lease_with_deadline_receipt_plus_factor_times_interval():
    before = store.server_now()
    answer = pod_leases.register("pod-a", "http://127.0.0.1:9001", proposed_interval=5)
    after = store.server_now()
    doc = stored_pod("pod-a")
    assert answer.outcome is Outcome.GRANTED and answer.lease_id == doc["leaseId"]
    assert answer.interval_seconds == 5 == doc["intervalSeconds"]
    assert before <= doc["lastReceiptAt"] <= after
    assert doc["expiryDeadline"] == doc["lastReceiptAt"] + timedelta(seconds=15)
    assert answer.expiry_deadline == doc["expiryDeadline"]
    assert doc["stopped"] is False and doc["endpoint"] == "http://127.0.0.1:9001"


@pytest.mark.parametrize("proposal, decided", [(1, 2), (2, 2), (7, 7), (60, 60), (3600, 60), (None, 10), (0, 10),
                                               (-5, 10), (True, 10), ("30", 10)])
def test_given_a_proposal_when_registering_then_the_server_clamps_it_into_bounds(proposal, decided):
    answer = pod_leases.register("pod-c", "http://127.0.0.1:9001", proposed_interval=proposal)
    assert answer.interval_seconds == decided
    doc = stored_pod("pod-c")
    assert doc["expiryDeadline"] - doc["lastReceiptAt"] == timedelta(seconds=3 * decided)


def test_given_granted_lease_when_renewing_then_deadline_is_last_receipt_plus_factor_times_interval():
    granted = pod_leases.register("pod-r", "http://x:1", proposed_interval=4)
    renewed = pod_leases.renew("pod-r", granted.lease_id)
    doc = stored_pod("pod-r")
    assert renewed.outcome is Outcome.RENEWED
    assert doc["lastReceiptAt"] == renewed.received_at >= granted.received_at
    assert doc["expiryDeadline"] == renewed.received_at + timedelta(seconds=12) == renewed.expiry_deadline
    assert doc["expiryDeadline"] >= granted.expiry_deadline


def test_given_duplicate_renewals_then_deadline_is_monotonic_and_never_past_the_last_receipt():
    granted = pod_leases.register("pod-d", "http://x:1", proposed_interval=2)
    deadlines = []
    for _ in range(5):
        answer = pod_leases.renew("pod-d", granted.lease_id)
        assert answer.outcome is Outcome.RENEWED
        deadlines.append(stored_pod("pod-d")["expiryDeadline"])
    assert deadlines == sorted(deadlines)
    doc = stored_pod("pod-d")
    assert doc["expiryDeadline"] == doc["lastReceiptAt"] + timedelta(seconds=6)


def test_given_a_later_deadline_when_a_delayed_or_replayed_renewal_arrives_then_the_deadline_does_not_move_backwards():
    granted = pod_leases.register("pod-late", "http://x:1", proposed_interval=2)
    # Given: a renewal that was received later already set a later deadline and receipt.
    later = stored_pod("pod-late")["expiryDeadline"] + timedelta(seconds=30)
    later_receipt = later - timedelta(seconds=6)
    store.pods().update_one({"_id": "pod-late"}, {"$set": {"expiryDeadline": later, "lastReceiptAt": later_receipt}})
    # When: the delayed (replayed) renewal is processed now.
    answer = pod_leases.renew("pod-late", granted.lease_id)
    # Then: both stay where the later renewal put them.
    doc = stored_pod("pod-late")
    assert answer.outcome is Outcome.RENEWED
    assert doc["expiryDeadline"] == later and doc["lastReceiptAt"] == later_receipt


def test_given_unknown_lease_id_when_renewing_then_stale_lease_and_nothing_changes():
    pod_leases.register("pod-s", "http://x:1")
    before = stored_pod("pod-s")
    answer = pod_leases.renew("pod-s", "unknownLeaseId123456789")
    assert answer.outcome is Outcome.STALE_LEASE and not answer.ok and answer.expiry_deadline is None
    assert stored_pod("pod-s") == before
    assert pod_leases.renew("never-registered", "unknownLeaseId123456789").outcome is Outcome.STALE_LEASE
    assert stored_pod("never-registered") is None


def test_given_deadline_passed_when_renewing_then_expired_is_terminal_and_nothing_changes():
    granted = pod_leases.register("pod-e", "http://x:1", proposed_interval=2)
    past = store.server_now() - timedelta(seconds=1)
    store.pods().update_one({"_id": "pod-e"}, {"$set": {"expiryDeadline": past}})
    before = stored_pod("pod-e")
    assert pod_leases.renew("pod-e", granted.lease_id).outcome is Outcome.EXPIRED
    assert pod_leases.renew("pod-e", granted.lease_id).outcome is Outcome.EXPIRED
    assert stored_pod("pod-e") == before
    assert not liveness.is_alive("pod-e")


def test_given_lost_renewals_when_deadline_passes_then_dead_until_reregistration_grants_a_fresh_lease():
    granted = pod_leases.register("pod-lost", "http://x:1", proposed_interval=2)
    deadline = stored_pod("pod-lost")["expiryDeadline"]
    # No renewal arrives: at the deadline (server time) the pod is dead.
    assert liveness.is_alive("pod-lost", now=deadline - timedelta(milliseconds=1))
    assert not liveness.is_alive("pod-lost", now=deadline)
    store.pods().update_one({"_id": "pod-lost"}, {"$set": {"expiryDeadline": store.server_now() - timedelta(milliseconds=5)}})
    assert pod_leases.renew("pod-lost", granted.lease_id).outcome is Outcome.EXPIRED
    again = pod_leases.register("pod-lost", "http://x:1", proposed_interval=2)
    assert again.outcome is Outcome.GRANTED and again.lease_id != granted.lease_id
    assert liveness.is_alive("pod-lost")
    # The old lease id is now unknown: stale, not a way back.
    assert pod_leases.renew("pod-lost", granted.lease_id).outcome is Outcome.STALE_LEASE


def test_given_live_lease_when_reregistering_with_blank_id_then_attaches_without_resetting_deadline():
    granted = pod_leases.register("pod-att", "http://x:1", proposed_interval=30)
    before = stored_pod("pod-att")
    attached = pod_leases.register("pod-att", "http://x:2", proposed_interval=2)
    doc = stored_pod("pod-att")
    assert attached.outcome is Outcome.ATTACHED and attached.lease_id == granted.lease_id
    assert attached.interval_seconds == 30
    assert doc["expiryDeadline"] == before["expiryDeadline"] and doc["lastReceiptAt"] == before["lastReceiptAt"]
    assert doc["endpoint"] == "http://x:2"


# A pod process whose own clock is hours off (libfaketime, as `faketime` runs it): it
# registers, renews and judges liveness, and reports what its own clock says.
SKEWED_POD = textwrap.dedent("""
    import json
    from datetime import datetime, timezone
    import django
    django.setup()
    from leases.pods import leases as pod_leases
    from leases.pods.liveness import LeasePodLiveness
    granted = pod_leases.register("pod-skew", "http://x:1", proposed_interval=2)
    renewed = pod_leases.renew("pod-skew", granted.lease_id)
    observer = LeasePodLiveness(self_pod="observer")
    print(json.dumps({"ownClock": datetime.now(timezone.utc).replace(tzinfo=None).isoformat(),
                      "renewed": renewed.outcome.value, "freshAlive": observer.is_alive("pod-skew"),
                      "expiredAlive": observer.is_alive("pod-expired"), "alivePods": sorted(observer.alive_pods())}))
""")


@pytest.mark.parametrize("skew_hours", [3, -3])
def test_given_pod_clock_skewed_by_hours_then_deadlines_and_liveness_still_follow_server_time(skew_hours):
    # given: a pod whose deadline passed a minute ago by the server's clock
    expired = pod_leases.register("pod-expired", "http://x:1", proposed_interval=2)
    assert expired.ok
    store.pods().update_one({"_id": "pod-expired"}, {"$set": {"expiryDeadline": store.server_now() - timedelta(minutes=1)}})
    before = store.server_now()
    # when: a pod process with its clock hours off registers, renews and judges liveness
    result = subprocess.run(
        ["faketime", "-f", f"{skew_hours:+d}h", PYTHON, "-c", SKEWED_POD], cwd=REPO, capture_output=True, text=True,
        timeout=120, env=child_env(FAKETIME_DONT_FAKE_MONOTONIC="1", LEASES_POD_INTERVAL_MIN="2",
                                   LEASES_POD_INTERVAL_MAX="60", LEASES_POD_EXPIRY_FACTOR="3"))
    after = store.server_now()
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    # the skew is real: the pod's own clock is hours away from the server's
    own_offset = datetime.fromisoformat(seen["ownClock"]) - after
    assert abs(own_offset - timedelta(hours=skew_hours)) < timedelta(minutes=10)
    # then: receipt and deadline are server times
    doc = stored_pod("pod-skew")
    assert seen["renewed"] == Outcome.RENEWED.value
    assert before <= doc["lastReceiptAt"] <= after
    assert doc["expiryDeadline"] == doc["lastReceiptAt"] + timedelta(seconds=6)
    # and liveness is judged by the server's clock: by the pod's own clock the fresh pod
    # would be dead (+3 h) and the expired one alive (-3 h)
    assert seen["freshAlive"] is True
    assert seen["expiredAlive"] is False
    assert seen["alivePods"] == ["observer", "pod-skew"]


def test_given_stopped_pod_when_reregistering_then_fresh_lease():
    first = pod_leases.register("pod-restart", "http://x:1")
    pod_leases.stop("pod-restart", first.lease_id)
    second = pod_leases.register("pod-restart", "http://x:1")
    assert second.outcome is Outcome.GRANTED and second.lease_id != first.lease_id
    assert stored_pod("pod-restart")["stopped"] is False


@pytest.mark.parametrize("pod_id, endpoint", [("$gt", "http://x:1"), ("a/b", "http://x:1"), ("", "http://x:1"),
                                              ("ok-pod", "ftp://x"), ("ok-pod", "http://x\x00"), ({"$ne": 1}, "")])
def test_given_bad_input_when_registering_then_typed_error_and_nothing_written(pod_id, endpoint):
    with pytest.raises(PodLeaseError) as caught:
        pod_leases.register(pod_id, endpoint)
    assert caught.value.code == "POD_LEASE_INVALID"
    assert store.pods().count_documents({}) == 0


def test_given_bad_lease_id_when_renewing_then_typed_error():
    pod_leases.register("pod-b", "http://x:1")
    for bad in ({"$ne": None}, "", "short", "x" * 65):
        with pytest.raises(PodLeaseError):
            pod_leases.renew("pod-b", bad)

