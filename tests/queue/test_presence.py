"""Liveness per process (leases.queue.presence) and one look per gate and process
(leases.queue.watch): what waiting costs the store does not grow with the waiters."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from datetime import timedelta
from functools import partial

import pytest

import leases
from leases.queue import order, presence, waiting, watch
from leases.store import client as store
from tests import helpers
from tests.helpers import PYTHON, REPO, child_env, define, lease_request, quiet_handler_fixture, wait_for

handler = quiet_handler_fixture("test")
req = partial(lease_request, pod="")
GATE = "res|global|*"


def queued(key=GATE):
    return helpers.queued_ids(key)


def test_given_twenty_waiters_in_one_process_then_one_heartbeat_and_one_read_a_period_keep_them_all(settings):
    # Given: a held cap-1 resource and 20 waiting threads of this process, a short ticket TTL.
    settings.LEASES_TICKET_TTL_MS = 1500
    settings.LEASES_WAIT_POLL_MS = 200
    define("res", "levels: {global: 1}\nwaitMs: 20000")
    held = leases.acquire(req(user="h"))
    waiters = [helpers.queue_up(req(user=f"w{i}"), GATE) for i in range(20)]
    try:
        # When: they wait two ticket TTLs.
        beats_before = presence.beats()
        with helpers.counted_commands(all_threads=True) as counter:
            time.sleep(2 * 1.5)
        beats = presence.beats() - beats_before
        # Then: none of them was dropped as stale, though none wrote its ticket; the
        # waiting cost a heartbeat a quarter TTL and a gate read a poll, for all 20.
        assert sorted(queued()) == sorted(w.ticket for w in waiters)
        assert all(w.is_alive() for w in waiters)
        assert counter.commands == [], counter.commands  # the waiters' own threads sent nothing
        reads = counter.background.count("aggregate")
        assert 1 <= beats <= 3.0 / presence.beat_period_s() + 2, counter.background
        assert 1 <= reads <= 3.0 / 0.2 + 2, counter.background
    finally:
        held.release()
        helpers.release_as_granted(waiters)


PAUSED_CHILD = """
import django; django.setup()
from django.conf import settings
settings.LEASES_TICKET_TTL_MS = 800
settings.LEASES_WAIT_POLL_MS = 200
import threading, leases
from leases.revocation import handlers
class Q(handlers.LeaseHandler):
    type = "test"
    def on_revoked(self, holder): pass
handlers.register_handler(Q())
def wait(i):
    lease = leases.acquire(leases.LeaseRequest(type="test", lease="res", tenant_id="acme", project_id="p1",
                                               user_id=f"child{i}", pod=""))
    print("granted", flush=True)
    lease.release()
threads = [threading.Thread(target=wait, args=(i,)) for i in range(3)]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_given_a_waiting_process_paused_past_the_ticket_ttl_then_its_tickets_go_stale_together_and_come_back(
        settings):
    settings.LEASES_TICKET_TTL_MS = 800
    define("res", "levels: {global: 1}\nwaitMs: 30000")
    held = leases.acquire(req(user="h"))
    child = subprocess.Popen([PYTHON, "-c", PAUSED_CHILD], cwd=REPO, env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(queued()) == 3, 30), child.stderr.read() if child.poll() is not None else ""
        first = sorted(queued())
        # When: the whole process stops for more than the TTL.
        child.send_signal(signal.SIGSTOP)
        time.sleep(0.8 * 1.5)
        presence.forget()
        gate = waiting.read_gate(GATE)
        # Then: all three of its tickets are stale at once (one heartbeat kept them all)...
        assert sorted(order.stale_ids(gate, gate["clock"])) == first
        waiting.prune(gate)
        assert queued() == []
        # ...and once it runs again its waiters notice and queue again, with new holders.
        child.send_signal(signal.SIGCONT)
        assert wait_for(lambda: len(queued()) == 3, 20), queued()
        held.release()
        out = [child.stdout.readline().strip() for _ in range(3)]
        assert out == ["granted"] * 3
        assert child.wait(20) == 0
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()


def test_given_a_full_queue_then_a_newcomer_is_refused_at_once_and_leaves_nothing(settings):
    # Given: a held cap-1 resource whose queue holds its limit (2 tickets).
    settings.LEASES_QUEUE_LIMIT = 2
    define("res", "levels: {global: 1}\nwaitMs: 20000")
    held = leases.acquire(req(user="h"))
    waiters = [helpers.queue_up(req(user=f"w{i}"), GATE) for i in range(2)]
    try:
        # When: a third asks, ready to wait 20 s.
        started = time.monotonic()
        with pytest.raises(leases.LeaseBusy) as refused:
            leases.acquire(req(user="late"))
        # Then: it is told at once that the queue is full; its holder is gone and the queue
        # still holds the two.
        assert time.monotonic() - started < 5
        assert refused.value.queue_full and "queue full" in str(refused.value)
        assert store.holders().count_documents({"userId": "late"}) == 0
        assert sorted(queued()) == sorted(w.ticket for w in waiters)
    finally:
        held.release()
        helpers.release_as_granted(waiters)


def test_given_no_waiter_on_a_gate_any_more_then_the_watcher_stops_reading_it():
    watch.add("some|global|*", "tk-1")
    watch.remove("some|global|*", "tk-1")
    before = watch.reads()
    time.sleep(waiting.poll_ms() / 1000.0 * 1.5)
    assert watch.latest("some|global|*", 60) is None
    assert watch.reads() == before


def test_given_a_ticket_of_this_process_that_no_waiter_waits_on_then_the_watcher_drops_it(settings):
    # Given: a waiter of this process queued, and beside it a ticket of this process whose
    # waiter is gone (its store step failed after it queued): the process's heartbeat would
    # keep that one alive, first in line, for as long as the process waits on the gate.
    from leases import service
    from leases.queue import wakeups

    settings.LEASES_WAIT_POLL_MS = 200
    define("res", "levels: {global: 1}\nwaitMs: 20000")
    held = leases.acquire(req(user="h"))
    orphan, _ = service.prepare(req(user="gone"))
    orphan.create_holder()
    now = store.server_now()
    waiting.enqueue(GATE, orphan.ticket("global", now, waker=wakeups.process_id()))
    waiter = helpers.queue_up(req(user="w"), GATE)
    try:
        # Then: the watcher drops the orphan, then its holder (the next command); the live
        # waiter stays queued.
        assert wait_for(lambda: queued() == [waiter.ticket], 10), queued()
        assert wait_for(lambda: store.holders().find_one({"_id": orphan.token}) is None, 10)
    finally:
        held.release()
        waiter.join(10)
    assert waiter.lease is not None, waiter.error
    waiter.lease.release()


def test_given_back_to_back_waits_shorter_than_a_beat_period_then_no_heartbeat_and_no_watcher_read(settings):
    # Given: two threads of this process taking turns on a cap-1 resource, each holding
    # 0.15 s, so that one of them always waits — each wait far shorter than a beat period
    # (a quarter of the 3 s ticket TTL) and the watcher's period (1 s).
    settings.LEASES_TICKET_TTL_MS = 3000
    settings.LEASES_WAIT_POLL_MS = 1000
    define("res", "levels: {global: 1}\nwaitMs: 20000")
    granted = []
    until = time.monotonic() + 2.5

    def take_turns(user):
        while time.monotonic() < until:
            lease = leases.acquire(req(user=user))
            granted.append(user)
            time.sleep(0.15)
            lease.release()

    beats, reads = presence.beats(), watch.reads()
    threads = [threading.Thread(target=take_turns, args=(f"u{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # Then: every ticket was alive by its own queueing, so the process wrote no heartbeat
    # (it used to beat every period while some waiter waited), and each waiter decided on
    # the gate its enqueue returned, so the watcher read nothing (it used to look at once
    # each time a wait began: a read a grant).
    assert len(granted) >= 10 and set(granted) == {"u0", "u1"}, granted
    assert presence.beats() - beats == 0
    assert watch.reads() - reads == 0


def test_given_many_threads_deciding_at_once_then_one_heartbeat_read_serves_them(settings):
    # Given: the heartbeats of 30 processes this process has never read, and tickets of theirs
    # old enough to need them now (queued 2 s ago, a ticket TTL of 1.5 s).
    settings.LEASES_TICKET_TTL_MS = 1500
    presence.forget()
    now = store.server_now()
    for i in range(30):
        store.presence().update_one({"_id": f"proc{i}"}, {"$currentDate": {"seen": True}}, upsert=True)
    tickets = [{"id": f"t{i}", "w": f"proc{i}", "seen": now - timedelta(seconds=2), "ttl": 1500} for i in range(30)]
    start = threading.Barrier(16)

    def decide():
        start.wait()
        presence.prefetch(tickets, now)  # as the order rule does before it ranks a gate's tickets
        for ticket in tickets:
            order.last_seen(ticket, now)

    # When: 16 threads decide on them at once.
    with helpers.counted_commands(all_threads=True) as counter:
        threads = [threading.Thread(target=decide) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    # Then: the heartbeats were read once for all of them (each thread used to read the keys
    # it found stale: up to one command per thread and key), and every ticket is alive.
    finds = counter.commands.count("find") + counter.background.count("find")
    assert 1 <= finds <= 2, counter.commands
    assert all(not order.is_suspect(t, now) for t in tickets)


def test_given_heartbeats_a_decision_looked_up_when_the_gate_is_read_again_then_they_come_along(settings):
    # Given: a gate, five processes' heartbeats and their tickets old enough to need them
    # (queued 2 s ago, a ticket TTL of 1.5 s); a decision on them read the heartbeats once.
    settings.LEASES_TICKET_TTL_MS = 1500
    define("res", "levels: {global: 1}\nwaitMs: 0")
    held = leases.acquire(req(user="h"))
    try:
        presence.forget()
        for i in range(5):
            presence.beat(f"proc{i}")
        now = store.server_now()
        tickets = [{"id": f"t{i}", "w": f"proc{i}", "seen": now - timedelta(seconds=2), "ttl": 1500} for i in range(5)]
        presence.prefetch(tickets, now)
        first = {t["id"]: order.last_seen(t, now) for t in tickets}
        # ... and that read is older than a refresh period now, the processes beat since.
        time.sleep(presence.refresh_s() + 0.05)
        for i in range(5):
            presence.beat(f"proc{i}")
        # When: the gate is read (as a release's hand-off and the watcher read it), and the
        # order rule decides on the gate as read.
        with helpers.counted_commands(all_threads=True) as counter:
            gate = waiting.read_gate(GATE)
            assert gate is not None and gate["_id"] == GATE and gate.get("clock") is not None
            presence.prefetch(tickets, gate["clock"])
            seen = {t["id"]: order.last_seen(t, gate["clock"]) for t in tickets}
            time.sleep(0.1)  # a background read, if any was started, is sent meanwhile
        # Then: one command, the gate read, brought the new heartbeats; the decision read none.
        assert counter.commands == ["aggregate"] and "find" not in counter.background, (counter.commands,
                                                                                        counter.background)
        assert all(seen[t] > first[t] for t in seen), (first, seen)
    finally:
        held.release()


def test_given_a_heartbeat_read_that_cannot_be_made_now_then_a_ticket_stale_by_older_knowledge_is_not_dropped(
        settings, monkeypatch):
    # Given: a live process (it beat just now) whose heartbeat this process last read long ago,
    # when it looked old, and its ticket queued 4 s ago (a ticket TTL of 1.5 s).
    settings.LEASES_TICKET_TTL_MS = 1500
    presence.forget()
    now = store.server_now()
    presence.beat("busy-proc")
    ticket = {"id": "t-busy", "w": "busy-proc", "seen": now - timedelta(seconds=4), "ttl": 1500}
    with presence._cache_lock:
        presence._cache["busy-proc"] = (now - timedelta(seconds=3), time.monotonic() - 10.0)
    # When: the read cannot be made now (another thread's read is under way: the store is
    # slow under load) and a decision asks whether the ticket is stale.
    monkeypatch.setattr(presence, "_read_bound_s", lambda: 0.05)
    with presence._read_lock:
        stale = order.is_stale(ticket, now)
    # Then: it is not dropped on what was known before; once a read is made, it shows the
    # process alive.
    assert stale is False
    assert order.is_stale(ticket, now) is False and order.last_seen(ticket, now) > now - timedelta(seconds=1)
    # A process that is gone is still dropped once its heartbeat is read.
    gone = {"id": "t-gone", "w": "gone-proc", "seen": now - timedelta(seconds=4), "ttl": 1500}
    assert order.is_stale(gone, now) is True


def test_given_kept_tickets_and_processes_looked_up_then_a_gate_read_brings_only_recent_processes_heartbeats(settings):
    # Given: a web process that looked up the keep-alives of 300 kept tickets (no process
    # names them: their deadlines are on the holders) and of two processes' tickets.
    presence.forget()
    now = store.server_now()
    old = now - timedelta(seconds=30)
    for i in range(300):
        presence.seen_of({"id": f"kept{i}", "seen": old, "ttl": 1500}, now)
    for name in ("procA", "procB"):
        presence.seen_of({"id": f"t-{name}", "w": name, "seen": old, "ttl": 1500}, now)
    mono = time.monotonic() + presence.refresh_s()  # their reads are due again by then
    # Then: what a gate read brings along is the two processes' heartbeats alone...
    assert sorted(presence._soon(mono)) == ["procA", "procB"]
    # ...and, once nothing asked about them for four refresh periods, nothing: the scan
    # lasts as long as the processes a decision looks up, not the keys it ever looked up.
    assert presence._soon(mono + 4 * presence.refresh_s()) == []
    assert presence._asked_processes == {}
