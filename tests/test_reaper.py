"""Scheduled sweep: dead-pod reap, reconcile (crash windows, safety margin, compare-and-set).

Ageing is done on stored server dates (``now=`` a server time past ``updatedAt``), never by
sleeping or by the client clock.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

import leases
from leases import config, handlers, listener, metrics, pods, reaper, store, sweeps
from leases.definitions import document_path
from leases.identity import self_pod_id

SAFETY_MS = 60000


class Recording(handlers.LeaseHandler):
    type = "rec"

    def __init__(self):
        self.seen = []

    def on_revoked(self, holder):
        self.seen.append(holder)


class CollectingListener:
    def __init__(self):
        self.holders = []

    def on_revoked(self, holders):
        self.holders.extend(holders)


@pytest.fixture
def recorder():
    handler = handlers.register_handler(Recording())
    yield handler
    handlers.unregister_handler("rec")


@pytest.fixture
def collected():
    previous = listener.get_listener()
    collecting = CollectingListener()
    listener.set_listener(collecting)
    yield collecting
    listener.set_listener(previous)


@pytest.fixture(autouse=True)
def _definition(settings):
    settings.LEASES_RECONCILE_SAFETY_MS = SAFETY_MS
    config.put_document("_vance", "_tenant", document_path("res"),
                        "levels: {global: 20, tenant: 10, project: 3, user: 2}\nttlSeconds: 60\nwaitMs: 0")


def acquire(user="u1", pod=None, pod_bound=False, project="p1"):
    return leases.acquire(leases.LeaseRequest(type="rec", lease="res", tenant_id="t1", project_id=project,
                                              user_id=user, pod=pod, pod_bound=pod_bound))


def counter(key):
    return store.counters().find_one({"_id": key})


def reap_value(reason):
    return metrics.REAP.labels(reason=reason)._value.get()


def test_given_crash_between_counter_inc_and_level_push_then_reconcile_corrects_only_after_the_safety_margin(recorder):
    # Given: a holder whose last counter increment never got its level push (crash window).
    lease = acquire()
    global_key = lease.levels[-1]
    store.holders().update_one({"_id": lease.token}, {"$pull": {"levels": global_key}})
    lease.release()  # returns only the registered levels; the global counter drifts by one
    drifted = counter(global_key)
    assert drifted["count"] == 1
    corrected_before = metrics.RECONCILE.labels(outcome="corrected")._value.get()
    # When: reconcile runs before the margin has passed (server time) — then: untouched.
    just_before = drifted["updatedAt"] + timedelta(milliseconds=SAFETY_MS - 1)
    assert sweeps.reconcile(now=just_before) == (0, False)
    assert counter(global_key) == drifted
    # When: past the margin — then: no holder books it, so the counter is deleted.
    past = drifted["updatedAt"] + timedelta(milliseconds=SAFETY_MS + 1)
    corrected, has_more = sweeps.reconcile(now=past)
    assert corrected >= 1 and has_more is False
    assert counter(global_key) is None
    assert metrics.RECONCILE.labels(outcome="corrected")._value.get() == corrected_before + 1


def test_given_fresh_drifted_counter_then_reconcile_never_touches_it(recorder):
    lease = acquire()
    key = lease.levels[0]
    store.counters().update_one({"_id": key}, {"$inc": {"count": 1}, "$currentDate": {"updatedAt": True}})
    fresh = counter(key)
    assert sweeps.reconcile() == (0, False)  # real server now: updatedAt is milliseconds old
    assert counter(key) == fresh
    lease.release()


def test_given_old_counter_higher_than_its_holders_then_reconcile_sets_it_to_the_booked_count(recorder):
    held = [acquire(user="u1"), acquire(user="u2")]
    tenant_key = held[0].levels[2]
    store.counters().update_one({"_id": tenant_key}, {"$inc": {"count": 2}})  # delete-then-crash, twice
    doc = counter(tenant_key)
    assert doc["count"] == 4
    sweeps.reconcile(now=doc["updatedAt"] + timedelta(milliseconds=SAFETY_MS + 1))
    assert counter(tenant_key)["count"] == 2
    for lease in held:
        lease.release()


def test_given_counter_changes_between_read_and_write_then_reconcile_leaves_it(recorder, monkeypatch):
    lease = acquire()
    key = lease.levels[-1]
    store.counters().update_one({"_id": key}, {"$inc": {"count": 1}})
    old = counter(key)
    real_booked = sweeps.booked_counts
    late = []

    def booked_then_acquire():
        booked = real_booked()
        late.append(acquire(user="u2"))  # an acquisition lands after reconcile read the counters
        return booked

    monkeypatch.setattr(sweeps, "booked_counts", booked_then_acquire)
    sweeps.reconcile(now=old["updatedAt"] + timedelta(milliseconds=SAFETY_MS + 1))
    after = counter(key)
    assert after["count"] == old["count"] + 1  # the in-flight acquisition's increment survives
    lease.release()
    late[0].release()


def test_given_dormant_counters_then_reconcile_deletes_them_and_stamps_unstamped_ones_first(recorder):
    lease = acquire()
    keys = list(lease.levels)
    lease.release()
    assert all(counter(k)["count"] == 0 for k in keys)
    store.counters().insert_one({"_id": "res|user|t9/u9", "resource": "res", "level": "user", "scope": "t9/u9",
                                 "tenantId": "t9", "count": 0, "cap": 2})  # created by the _id upsert only
    now = store.server_now() + timedelta(milliseconds=SAFETY_MS + 1000)
    sweeps.reconcile(now=now)
    assert all(counter(k) is None for k in keys)
    stamped = counter("res|user|t9/u9")
    assert stamped is not None and "updatedAt" in stamped  # not deleted yet: it only now starts to age
    sweeps.reconcile(now=stamped["updatedAt"] + timedelta(milliseconds=SAFETY_MS + 1))
    assert counter("res|user|t9/u9") is None


def test_given_holders_of_dead_alive_and_detached_pods_then_pod_reap_takes_only_the_dead_pods_leases(recorder, collected):
    pods.register("alive-pod", "http://127.0.0.1:9")
    stopped = pods.register("stopped-pod", "http://127.0.0.1:9")
    pods.stop("stopped-pod", stopped.lease_id)
    expired = pods.register("expired-pod", "http://127.0.0.1:9", proposed_interval=2)
    store.pods().update_one({"_id": "expired-pod"}, {"$set": {"expiryDeadline": store.server_now() - timedelta(seconds=1)}})
    leases_by_pod = {
        "alive-pod": acquire(user="a", pod="alive-pod"),
        "stopped-pod": acquire(user="b", pod="stopped-pod", pod_bound=True),
        "expired-pod": acquire(user="c", pod="expired-pod", project="p2"),
        "ghost-pod": acquire(user="d", pod="ghost-pod", project="p2"),  # never registered
        "": acquire(user="e", pod="", project="p3"),  # detached: idle reap only
        self_pod_id(): acquire(user="f", project="p3"),  # the own pod is always alive
    }
    pod_before = reap_value("pod")
    reaped, has_more = sweeps.reap_dead_pods()
    assert (reaped, has_more) == (3, False)
    remaining = {doc["pod"] for doc in store.holders().find({}, {"pod": 1})}
    assert remaining == {"alive-pod", "", self_pod_id()}
    assert {h.pod for h in collected.holders} == {"stopped-pod", "expired-pod", "ghost-pod"}
    assert all(h.reason == "pod" for h in collected.holders)
    assert reap_value("pod") == pod_before + 3
    for pod in ("stopped-pod", "expired-pod", "ghost-pod"):
        assert store.tombstones().find_one({"_id": leases_by_pod[pod].token})["reason"] == "pod"
    # The counters book exactly the surviving holders.
    booked = sweeps.booked_counts()
    for doc in store.counters().find({}):
        assert doc["count"] == booked.get(doc["_id"], 0), doc
    for lease in leases_by_pod.values():
        lease.release()


def test_given_many_expired_holders_when_sweeping_with_a_bound_then_it_reports_more_and_finishes_later(recorder, collected):
    made = [acquire(user=f"u{i}", project=f"p{i}") for i in range(5)]
    store.holders().update_many({}, {"$set": {"expiresAt": store.server_now() - timedelta(seconds=1)}})
    idle_before = reap_value("idle")
    done, has_more = sweeps.sweep(limit=2)
    assert done == 2 and has_more is True
    while has_more:
        more, has_more = sweeps.sweep(limit=2)
        done += more
    assert done >= 5 and store.holders().count_documents({}) == 0
    assert reap_value("idle") == idle_before + 5
    assert len(collected.holders) == 5 and {h.token for h in collected.holders} == {m.token for m in made}
    for lease in made:
        with pytest.raises(leases.LeaseLost):
            lease.check()


def test_given_sweeps_racing_then_each_holder_is_reaped_and_decremented_once(recorder, collected):
    made = [acquire(user=f"u{i}", project=f"p{i}") for i in range(2)]
    store.holders().update_many({}, {"$set": {"expiresAt": store.server_now() - timedelta(seconds=1)}})
    now = store.server_now()
    first = reaper.reap_idle(now=now)
    second = reaper.reap_idle(now=now)
    assert first == (2, False) and second == (0, False)
    assert all(doc["count"] == 0 for doc in store.counters().find({}))
    assert len(made) == len(collected.holders)


def test_given_long_dead_pod_without_holders_then_it_is_pruned_but_one_with_holders_stays(recorder):
    pods.register("old-a", "http://x:1")
    pods.register("old-b", "http://x:1")
    lease = acquire(pod="old-b")
    store.pods().update_many({}, {"$set": {"expiryDeadline": store.server_now() - timedelta(days=2)}})
    assert sweeps.prune_pods() == 1
    assert {d["_id"] for d in store.pods().find({})} == {"old-b"}
    lease.release()
