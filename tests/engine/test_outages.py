"""MongoDB outages: every step ends within one bound, store failures are Unavailable (never
Busy), and a release that failed can be retried.

The outage is real: a private embedded server of this test, frozen with SIGSTOP.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from functools import partial

import pytest

import leases
from leases.definitions import invalidation, model as definitions
from leases.engine import funnel
from leases.queue import waiting
from leases.revocation import handlers
from leases.store import client as store
from leases.store.embedded import start_server
from tests.helpers import define, discard_server, lease_request, wait_for

TIMEOUT_MS = 1500


class Quiet(handlers.LeaseHandler):
    type = "test"

    def on_revoked(self, holder):
        pass


def wait_stopped(pid, within=2.0):
    """Wait until every thread of ``pid`` is stopped: kill() returns before a group stop is done,
    and a server thread still running can answer one more command (a release that "got through")."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    states.append(stat.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                continue  # a thread that just ended
        if states and all(state in "Tt" for state in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"server {pid} not stopped within {within} s")


@pytest.fixture
def frozen_store(settings):
    """A private server for this test; yields ``(freeze, thaw)``."""
    server = start_server(":memory:")
    settings.MONGODB_URI = server.uri
    settings.LEASES_MONGO_TIMEOUT_MS = TIMEOUT_MS
    store.reset()
    definitions.cache.clear()
    handlers.register_handler(Quiet())
    state = {"frozen": False}

    def freeze():
        os.kill(server.pid, signal.SIGSTOP)
        state["frozen"] = True
        wait_stopped(server.pid)

    def thaw():
        os.kill(server.pid, signal.SIGCONT)
        state["frozen"] = False

    try:
        yield freeze, thaw
    finally:
        if state["frozen"]:
            thaw()
        handlers.unregister_handler("test")
        store.reset()
        discard_server(server)
        definitions.cache.clear()


put = partial(define, "res")
req = partial(lease_request, pod="")


def test_given_mongodb_freezes_when_acquiring_then_it_ends_unavailable_within_one_bound(frozen_store):
    freeze, thaw = frozen_store
    put("levels: {global: 5, tenant: 5}\nwaitMs: 0")
    assert invalidation.wait_listening()
    leases.acquire(req()).release()  # definition cached: the acquire below needs only the store
    freeze()
    started = time.monotonic()
    with pytest.raises(leases.LeaseUnavailable):
        leases.acquire(req(user="u2"))
    elapsed = time.monotonic() - started
    thaw()
    # One bound for the whole attempt, its rollback included (before: one per command).
    assert elapsed < TIMEOUT_MS / 1000 * 1.6, elapsed


def test_given_an_outage_right_after_a_level_is_found_full_then_it_is_unavailable_not_busy(frozen_store, monkeypatch):
    freeze, thaw = frozen_store
    put("levels: {global: 1}\nwaitMs: 0")
    held = leases.acquire(req())
    real = waiting.read_gate

    def frozen_read(key):  # the miss happened; the store dies before the diagnosis read
        freeze()
        return real(key)

    monkeypatch.setattr(waiting, "read_gate", frozen_read)
    with pytest.raises(leases.LeaseUnavailable) as err:
        leases.acquire(req(user="u2"))
    assert not isinstance(err.value, leases.LeaseBusy)
    monkeypatch.undo()
    thaw()
    held.release()


def test_given_a_release_fails_in_an_outage_then_it_raises_and_can_be_retried(frozen_store):
    freeze, thaw = frozen_store
    put("levels: {global: 1}\nwaitMs: 0")
    lease = leases.acquire(req())
    freeze()
    with pytest.raises(leases.LeaseUnavailable):
        lease.release()
    thaw()
    # The retry reaches MongoDB and releases (the client reconnects first: retry a few times,
    # as a caller of a retryable call does).
    result = None
    deadline = time.monotonic() + 15
    while result is None and time.monotonic() < deadline:
        try:
            result = lease.release()
        except leases.LeaseUnavailable:
            time.sleep(0.2)
    assert result is True
    assert lease.release() is False
    doc = store.counters().find_one({"_id": "res|global|*"})
    assert doc["count"] == 0 and doc["holders"] == []
    leases.acquire(req(user="u2")).release()  # the slot is free again at once


def test_given_mongodb_freezes_when_acquiring_then_the_error_names_the_host_it_tried(frozen_store, settings):
    freeze, thaw = frozen_store
    put("levels: {global: 5}\nwaitMs: 0")
    leases.acquire(req()).release()
    host = settings.MONGODB_URI.split("://", 1)[1].split("/", 1)[0]  # 127.0.0.1:<this server's port>
    freeze()
    with pytest.raises(leases.LeaseUnavailable) as err:
        leases.acquire(req(user="u2"))
    thaw()
    assert f" at {host}" in str(err.value), str(err.value)  # "… unreachable at …" or "… error at …"


def test_given_a_uri_with_credentials_then_the_host_named_in_errors_leaves_them_out():
    uri = "mongodb://ops:s3cret@db1.example:27017,db2.example:27017/leases?replicaSet=rs0&authSource=admin"
    assert store.where(uri) == "db1.example:27017,db2.example:27017"
    assert store.where("mongodb+srv://ops:s3cret@cluster0.example.net/?retryWrites=true") == "cluster0.example.net"
    assert "s3cret" not in store.where("ops:s3cret@nowhere")  # not a URI: named as such, never echoed


def test_given_the_store_stalls_longer_than_a_beat_period_then_the_heartbeat_still_lands(frozen_store, settings):
    # Given: a beat period of 0.75 s (ticket TTL 3 s) and a store bound of TIMEOUT_MS.
    from leases.queue import presence

    freeze, thaw = frozen_store
    settings.LEASES_TICKET_TTL_MS = 3000
    assert TIMEOUT_MS / 1000 > 1.2
    store.presence().update_one({"_id": "slow-proc"}, {"$currentDate": {"seen": True}}, upsert=True)
    # When: the store stalls 1.2 s while a beat is on its way (a loaded store answers that late).
    freeze()
    result = {}
    beating = threading.Thread(target=lambda: result.setdefault("landed", presence.beat_once("slow-proc")))
    beating.start()
    time.sleep(1.2)
    thaw()
    beating.join(10)
    # Then: the beat waited for the store (its bound is the store's, not a beat period) and
    # landed: the process's tickets are a beat younger, not a period older.
    assert result == {"landed": True}


def test_given_a_step_that_spent_its_bound_then_its_rollback_is_sent_again_and_what_it_booked_comes_back(
        frozen_store, monkeypatch):
    # Given: an acquire whose store stalls past the bound after it booked its levels and
    # before it marks its holder HELD: the step's bound is spent, so its rollback cannot be
    # sent under it (a store that answers slowly under load, not only a frozen one).
    freeze, thaw = frozen_store
    put("levels: {global: 1}\nwaitMs: 0")
    assert invalidation.wait_listening()
    leases.acquire(req()).release()

    def stall(name):
        if name == "acquire":
            freeze()
            time.sleep(TIMEOUT_MS / 1000 + 0.2)
            thaw()

    monkeypatch.setattr(funnel, "_pause_point", stall)
    with pytest.raises(leases.LeaseUnavailable):
        leases.acquire(req(user="u2"))
    monkeypatch.undo()
    # Then: the rollback is sent again with a bound of its own, once the store answers: the
    # holder is gone and the slot is free within one bound — not at the holder's deadline,
    # or at the next repair of a full gate.
    def undone():
        gate = store.counters().find_one({"_id": "res|global|*"}) or {}
        return store.holders().count_documents({}) == 0 and not gate.get("holders") and not gate.get("count")
    assert wait_for(undone, TIMEOUT_MS / 1000 * 2, 0.02), (list(store.holders().find()),
                                                           store.counters().find_one({"_id": "res|global|*"}))
    leases.acquire(req(user="u3")).release()
