"""leases.upkeep.sweeps.sweep, the beat's round as a whole: bounded, ``(done, has_more)``,
reaps expired holders and dead pods' holders, reconciles, and does nothing the second time.

Holders are made by real acquisitions; ageing is done on stored server dates, never by
sleeping. The step functions alone are tested in test_reaper.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

import leases
from leases.pods import leases as pod_leases
from leases.revocation import handlers, listener
from leases.store import client as store, entries
from leases.upkeep import sweeps
from tests.helpers import define, lease_request

SAFETY_MS = 60000  # no counter is old enough to be deleted within a test


class Collecting:
    """The revocation listener for these tests: the holders each sweep hands over."""

    def __init__(self) -> None:
        self.holders: list = []

    def on_revoked(self, holders) -> None:
        self.holders.extend(holders)


class _Quiet(handlers.LeaseHandler):
    type = "sweeptest"

    def on_revoked(self, holder) -> None:
        pass


@pytest.fixture(autouse=True)
def world(settings):
    """The lease ``res`` of type ``sweeptest``; yields the listener the sweeps hand holders to."""
    settings.LEASES_RECONCILE_SAFETY_MS = SAFETY_MS
    define("res", "levels: {global: 20, tenant: 10, project: 3, user: 2}\nttlSeconds: 60\nwaitMs: 0")
    handlers.register_handler(_Quiet())
    previous = listener.get_listener()
    collected = Collecting()
    listener.set_listener(collected)
    yield collected
    listener.set_listener(previous)
    handlers.unregister_handler(_Quiet.type)


def acquire(user: str, project: str = "p1", pod: str | None = None) -> leases.Lease:
    return leases.acquire(lease_request(lease_type="sweeptest", tenant="t1", project=project, user=user, pod=pod))


def expire(*held: leases.Lease) -> None:
    """Their TTL ran out a second ago, on the server's clock."""
    store.holders().update_many({"_id": {"$in": [h.token for h in held]}},
                                {"$set": {"expiresAt": store.server_now() - timedelta(seconds=1)}})


def counters() -> dict[str, tuple[int, list[str]]]:
    return {d["_id"]: (d["count"], sorted(d["holders"])) for d in store.counters().find({})}


def booked_by_survivors() -> dict[str, tuple[int, list[str]]]:
    """What each counter must book: exactly the holders that are left."""
    want: dict[str, list[str]] = {}
    for doc in store.holders().find({}):
        for key in doc["levels"]:
            want.setdefault(key, []).append(entries.holder_entry(doc))
    return {key: (len(want.get(key, [])), sorted(want.get(key, []))) for key in counters()}


def test_given_expired_dead_pod_and_live_holders_when_one_sweep_runs_then_only_the_first_two_are_reaped(world):
    pod_leases.register("dead-pod", "http://127.0.0.1:9", proposed_interval=2)
    store.pods().update_one({"_id": "dead-pod"}, {"$set": {"expiryDeadline": store.server_now() - timedelta(seconds=1)}})
    expired, live = acquire("u1", pod=""), acquire("u2", pod="")
    on_dead_pod = acquire("u3", project="p2", pod="dead-pod")
    expire(expired)

    assert sweeps.sweep(limit=10) == (2, False)

    assert {d["_id"] for d in store.holders().find({})} == {live.token}
    assert {(h.token, h.reason) for h in world.holders} == {(expired.token, "idle"), (on_dead_pod.token, "pod")}
    for gone, reason in ((expired, "idle"), (on_dead_pod, "pod")):
        assert store.tombstones().find_one({"_id": gone.token})["reason"] == reason
        with pytest.raises(leases.LeaseLost):
            gone.check()
    assert counters() == booked_by_survivors()
    live.check()
    live.release()


def test_given_a_finished_sweep_when_sweeping_again_then_nothing_is_written_and_nobody_is_revoked_twice(world):
    held = [acquire(f"u{i}", project=f"p{i}", pod="") for i in range(3)]
    expire(*held[:2])
    assert sweeps.sweep() == (2, False)
    before = list(store.counters().find({}, sort=[("_id", 1)]))
    tombstones = list(store.tombstones().find({}, sort=[("_id", 1)]))

    assert sweeps.sweep() == (0, False)
    assert sweeps.sweep() == (0, False)

    assert list(store.counters().find({}, sort=[("_id", 1)])) == before  # not even updatedAt moved
    assert list(store.tombstones().find({}, sort=[("_id", 1)])) == tombstones
    assert sorted(h.token for h in world.holders) == sorted(h.token for h in held[:2])  # each once
    held[2].release()


def test_given_more_expired_holders_than_the_bound_then_each_round_reaps_at_most_the_bound_and_says_more(world):
    held = [acquire(f"u{i}", project=f"p{i % 3}", pod="") for i in range(5)]
    expire(*held)

    rounds = [sweeps.sweep(limit=2) for _ in range(4)]

    assert rounds == [(2, True), (2, True), (1, False), (0, False)]
    assert store.holders().count_documents({}) == 0
    assert all(count == 0 and not booked for count, booked in counters().values())
    assert sorted(h.token for h in world.holders) == sorted(h.token for h in held)


def test_given_an_entry_left_by_a_crash_after_the_holder_delete_then_the_sweep_reconciles_it_once(world):
    crashed, live = acquire("u1", pod=""), acquire("u2", pod="")
    store.holders().delete_one({"_id": crashed.token})  # the release died before its pulls

    assert sweeps.sweep(reconcile_counters=False) == (0, False)  # the reaps alone do not see it
    assert counters() != booked_by_survivors()
    done, has_more = sweeps.sweep()
    assert done == len(crashed.levels) and has_more is False  # one entry pulled per counter
    assert counters() == booked_by_survivors()
    assert sweeps.sweep() == (0, False)
    assert world.holders == []  # a pulled entry is no revocation
    live.release()


def test_given_heartbeats_of_waiting_processes_then_the_sweep_forgets_only_those_silent_for_an_hour():
    from leases.queue import presence

    presence.beat("proc-live")
    presence.beat("proc-gone")
    store.presence().update_one({"_id": "proc-gone"}, {"$set": {"seen": store.server_now() - timedelta(hours=2)}})
    assert sweeps.prune_presence() == 1
    assert [d["_id"] for d in store.presence().find({})] == ["proc-live"]
