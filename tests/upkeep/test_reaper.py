"""Scheduled sweep: dead-pod reap, reconcile (crash windows, safety margin, compare-and-set).

Ageing is done on stored server dates (``now=`` a server time past ``updatedAt``), never by
sleeping or by the client clock.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.pods import leases as pod_leases
from leases.pods.identity import self_pod_id
from leases.revocation import handlers, listener
from leases.store import client as store
from leases.telemetry import metrics
from leases.upkeep import reaper, sweeps

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


def test_given_crash_after_the_holder_delete_then_reconcile_pulls_its_entries_at_once(recorder):
    # Given: a release that deleted its holder and died before returning the slots.
    lease = acquire()
    store.holders().delete_one({"_id": lease.token})
    assert all(counter(k)["count"] == 1 for k in lease.levels)
    corrected_before = metrics.RECONCILE.labels(outcome="corrected")._value.get()
    # When: reconcile runs right away (no safety margin: the entry names its holder).
    corrected, has_more = sweeps.reconcile()
    # Then: every level's entry is pulled, exactly once.
    assert (corrected, has_more) == (4, False)
    assert all(counter(k)["count"] == 0 and counter(k)["holders"] == [] for k in lease.levels)
    assert metrics.RECONCILE.labels(outcome="corrected")._value.get() == corrected_before + 4
    assert sweeps.reconcile() == (0, False)


def test_given_an_acquisition_in_flight_then_reconcile_leaves_its_entries(recorder):
    # Given: a holder (PENDING) that booked its first level and has not finished (alive).
    lease = acquire()
    store.holders().update_one({"_id": lease.token}, {"$set": {"state": "PENDING", "levels": []}})
    # When: reconcile runs long after any margin.
    sweeps.reconcile(now=store.server_now() + timedelta(milliseconds=SAFETY_MS * 10))
    # Then: its holder document exists, so its bookings stand.
    assert all(counter(k)["count"] == 1 for k in lease.levels)


def test_given_a_count_that_differs_from_its_entries_then_reconcile_sets_it_to_the_list(recorder):
    held = [acquire(user="u1"), acquire(user="u2")]
    tenant_key = held[0].levels[2]
    store.counters().update_one({"_id": tenant_key}, {"$inc": {"count": 2}})  # a hand edit
    assert counter(tenant_key)["count"] == 4
    sweeps.reconcile()
    assert counter(tenant_key)["count"] == 2 and len(counter(tenant_key)["holders"]) == 2
    for lease in held:
        lease.release()
    assert counter(tenant_key)["count"] == 0


def test_given_reconcile_and_lazy_repair_racing_then_a_slot_comes_back_once(recorder):
    from leases.queue import waiting

    # Given: two holders; one vanished after its delete (its entries left behind).
    alive, dead = acquire(user="u1"), acquire(user="u2")
    store.holders().delete_one({"_id": dead.token})
    key = dead.levels[-1]
    before = counter(key)
    # When: the lazy repair of a full counter and the sweep both return the dead entry.
    assert waiting.repair({**before, "count": before["cap"]}, store.server_now()) is True
    sweeps.reconcile()
    # Then: only the dead holder's slot came back, once; the live one still books its slot.
    after = counter(key)
    assert after["count"] == 1 and after["holders"] == [e for e in before["holders"] if alive.token in e]
    alive.release()
    assert counter(key)["count"] == 0


@pytest.mark.parametrize("sweep", ["repair", "reconcile"])
def test_given_an_entry_of_an_earlier_attempt_of_a_live_holder_then_it_is_pulled_and_the_current_one_stays(
        recorder, sweep):
    from leases.queue import waiting
    from leases.store import entries

    # Given: a holder whose document was written again (a new attemptId) while an entry of
    # its earlier attempt stayed booked; and a four-part entry (booked by a version from
    # before attempts), which counts for its token's holder whatever its attemptId.
    lease, legacy = acquire(user="u1"), acquire(user="u2")
    key = lease.levels[-1]
    earlier = entries.entry("t1", "p1", "u1", lease.token, "0123456789ab")
    old_shape = entries.entry("t1", "p1", "u2", legacy.token)
    store.counters().update_one({"_id": key}, {"$push": {"holders": {"$each": [earlier, old_shape]}},
                                               "$inc": {"count": 2}})
    store.counters().update_one({"_id": key}, {"$pull": {"holders": legacy._booking()}, "$inc": {"count": -1}})
    # When: the lazy repair or the sweep checks the counter.
    if sweep == "repair":
        doc = waiting.read_gate(key)
        assert waiting.repair(doc, doc["clock"]) is True
    else:
        sweeps.reconcile()
    # Then: only the earlier attempt's entry came back; both live bookings stay.
    after = counter(key)
    assert after["holders"] == [lease._booking(), old_shape] and after["count"] == 2
    lease.release()
    store.counters().update_one({"_id": key}, {"$pull": {"holders": old_shape}, "$inc": {"count": -1}})
    legacy.release()


def test_given_a_holder_written_again_by_another_attempt_then_marking_it_held_by_the_earlier_one_matches_nothing(
        recorder):
    from leases import service
    from leases.store import holder_commands as commands

    # Given: an attempt at a token whose holder was written again (a new attemptId) since.
    attempt, _ = service.prepare(leases.LeaseRequest(type="rec", lease="res", tenant_id="t1", project_id="p1",
                                                     user_id="u1"))
    attempt.create_holder()
    earlier = attempt.attempt_id
    attempt.create_holder()
    # When: the earlier attempt marks it HELD. Then: nothing matches (its entries book for
    # nobody), while the current attempt does.
    held = store.holders().update_one(*commands.mark_held(attempt.token, keys=attempt.keys, ttl_seconds=60,
                                                          attempt_id=earlier))
    assert held.matched_count == 0 and store.holders().find_one({"_id": attempt.token})["state"] == "PENDING"
    lease = attempt.book(privileged=False, allow_queue=False)
    assert lease.attempt_id == attempt.attempt_id != earlier
    assert all(counter(k)["holders"] == [attempt.booking] for k in attempt.keys)
    lease.release()


def test_given_a_counter_written_before_entries_then_it_is_converted_without_losing_a_slot(recorder):
    # Given: the old shape: a count and holders that register the key in ``levels`` only.
    lease = acquire()
    key = lease.levels[-1]
    store.counters().update_one({"_id": key}, {"$unset": {"holders": ""}, "$inc": {"count": 1}})
    store.holders().update_one({"_id": lease.token}, {"$unset": {"keys": ""}})
    old = counter(key)
    # When: the migration's conversion runs.
    assert sweeps.convert_legacy_counters() == 1
    # Then: the count is what the holders book, each by entry, and release returns it.
    converted = counter(key)
    assert converted["count"] == 1 and len(converted["holders"]) == 1 and lease.token in converted["holders"][0]
    assert old["count"] == 2
    assert lease.release() is True
    assert counter(key)["count"] == 0


def test_given_an_acquire_on_a_counter_written_before_entries_then_it_converts_it_first(recorder):
    lease = acquire()
    key = lease.levels[-1]
    store.counters().update_one({"_id": key}, {"$unset": {"holders": ""}})
    second = acquire(user="u2")
    doc = counter(key)
    assert doc["count"] == 2 and sorted(e.rsplit("/", 1)[1] for e in doc["holders"]) == sorted(
        [lease.token, second.token])


def test_given_dormant_counters_then_reconcile_deletes_them_after_the_margin(recorder):
    lease = acquire()
    keys = list(lease.levels)
    lease.release()
    assert all(counter(k)["count"] == 0 for k in keys)
    sweeps.reconcile()
    assert all(counter(k) is not None for k in keys)  # fresh: kept
    sweeps.reconcile(now=store.server_now() + timedelta(milliseconds=SAFETY_MS + 1000))
    # The narrower ones go; the gate stays: its fence slots are where the generations live.
    assert all(counter(k) is None for k in keys[:-1])
    assert counter(keys[-1])["count"] == 0 and counter(keys[-1])["fence"]


def test_given_holders_of_dead_alive_and_detached_pods_then_pod_reap_takes_only_the_dead_pods_leases(recorder, collected):
    pod_leases.register("alive-pod", "http://127.0.0.1:9")
    stopped = pod_leases.register("stopped-pod", "http://127.0.0.1:9")
    pod_leases.stop("stopped-pod", stopped.lease_id)
    pod_leases.register("expired-pod", "http://127.0.0.1:9", proposed_interval=2)
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
    pod_leases.register("old-a", "http://x:1")
    pod_leases.register("old-b", "http://x:1")
    lease = acquire(pod="old-b")
    store.pods().update_many({}, {"$set": {"expiryDeadline": store.server_now() - timedelta(days=2)}})
    assert sweeps.prune_pods() == 1
    assert {d["_id"] for d in store.pods().find({})} == {"old-b"}
    lease.release()
