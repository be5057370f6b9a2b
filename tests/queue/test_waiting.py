"""The waiting queue: no barging, tenant-fair order, no head-of-line blocking, wake-ups,
dead waiters leave, outages end in LeaseUnavailable, budgets per grant."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import contextmanager
from functools import partial

import pytest

import leases
from leases import service
from leases.queue import grants, presence, slots, waiting, wakeups, watch
from leases.store import client as store, entries
from tests import helpers
from tests.helpers import PYTHON, REPO, child_env, define, lease_request, quiet_handler_fixture, wait_for

handler = quiet_handler_fixture("test")


put = define
req = partial(lease_request, pod="")


def gate_doc(key="res|global|*"):
    return store.counters().find_one({"_id": key}) or {}


def queued_ids(key="res|global|*"):
    return helpers.queued_ids(key)


def until(predicate, timeout=10.0, step=0.01):
    value = wait_for(predicate, timeout, step)
    if not value:
        raise AssertionError("condition not reached in time")
    return value


def queue_up(request, key="res|global|*"):
    """Start a waiter and return once its ticket is in the queue (arrival order is fixed)."""
    return helpers.queue_up(request, key)


def test_given_a_queue_when_a_slot_frees_then_a_newcomer_cannot_barge():
    put("res", "levels: {global: 1}\nwaitMs: 10000")
    holder = leases.acquire(req(user="h"))
    waiter = queue_up(req(user="w"))
    holder.release()
    # Then: the freed slot belongs to the queued waiter, whatever the newcomer does.
    with pytest.raises(leases.LeaseBusy):
        leases.acquire(req(user="newcomer", wait_ms=0))
    waiter.join(10)
    assert waiter.lease is not None and waiter.lease.request.user_id == "w"
    waiter.lease.release()


def test_given_tenants_waiting_then_the_tenant_holding_fewest_goes_first_and_then_the_oldest():
    put("res", "levels: {global: 2}\nwaitMs: 10000")
    a_held = leases.acquire(req(tenant="a", user="a0"))
    c_held = leases.acquire(req(tenant="c", user="c0"))
    a1 = queue_up(req(tenant="a", user="a1"))
    a2 = queue_up(req(tenant="a", user="a2"))
    b1 = queue_up(req(tenant="b", user="b1"))  # newest, but tenant b holds nothing
    c_held.release()
    b1.join(10)
    assert b1.lease is not None and a1.lease is None and a2.lease is None
    a_held.release()  # a now holds 0, b holds 1: a's oldest goes next
    a1.join(10)
    assert a1.lease is not None and a2.lease is None
    for w in (a1, b1):
        w.lease.release()
    a2.join(10)
    assert a2.lease is not None
    a2.lease.release()


def test_given_a_ticket_its_own_tenant_cap_blocks_then_it_does_not_hold_back_other_tenants():
    put("res", "levels: {global: 3, tenant: 1}\nwaitMs: 10000")
    a_held = leases.acquire(req(tenant="a", user="a0"))
    x_held = leases.acquire(req(tenant="x", user="x0"))
    y_held = leases.acquire(req(tenant="y", user="y0"))
    blocked = queue_up(req(tenant="a", user="a1"))  # oldest, blocked by its tenant cap
    b1 = queue_up(req(tenant="b", user="b1"))
    x_held.release()
    b1.join(10)
    assert b1.lease is not None and blocked.lease is None
    a_held.release()
    blocked.join(10)
    assert blocked.lease is not None
    for lease in (blocked.lease, b1.lease, y_held):
        lease.release()


def test_given_wait_timeout_then_busy_names_the_level_and_the_place_and_the_ticket_is_gone():
    put("res", "levels: {global: 1}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    first = queue_up(req(user="w1", wait_ms=3000))
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(user="w2", wait_ms=300))
    assert busy.value.level == "global" and busy.value.count == 1 and busy.value.cap == 1
    assert busy.value.position == 2
    assert queued_ids() == [first.ticket]  # w1's ticket still waits; w2's left with its busy answer
    first.join(10)
    assert first.error is not None and first.error.position == 1
    assert queued_ids() == []
    assert store.holders().count_documents({}) == 1  # only the holder: no waiter left a document
    held.release()


def test_given_wakeups_are_lost_then_waiters_are_still_granted_by_their_own_poll(monkeypatch, settings):
    settings.LEASES_WAIT_POLL_MS = 200
    monkeypatch.setattr(wakeups, "wake", lambda ticket_id, process, hint=None: wakeups.UNKNOWN)  # as if Redis were down
    put("res", "levels: {global: 1}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    waiter = queue_up(req(user="w"))
    held.release()
    waiter.join(10)
    assert waiter.lease is not None
    waiter.lease.release()


def test_given_a_release_then_only_the_picked_waiter_is_woken():
    # (The waiters run in this process: delivery is local, through the same events the
    # subscriber sets for messages from other processes.)
    put("res", "levels: {global: 1}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    waiters = [queue_up(req(user=f"w{i}")) for i in range(3)]
    woken = []
    real = wakeups._deliver

    def spy(ids):
        ids = list(ids)
        woken.extend(ids)
        return real(ids)

    wakeups._deliver, saved = spy, real
    try:
        held.release()
        until(lambda: waiters[0].lease is not None)
    finally:
        wakeups._deliver = saved
    assert woken == [waiters[0].lease.token]
    for w in waiters:
        until(lambda w=w: w.lease is not None)
        w.lease.release()


def test_given_a_waiter_whose_ticket_was_pruned_when_its_wakeup_comes_then_it_does_not_book_ahead_of_the_queue():
    # Given: a free gate slot (cap 2, one held) and two waiters queued; the first one stalled
    # past the ticket TTL, so its ticket (and holder document) was pruned.
    put("res", "levels: {global: 2}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    late, _ = service.prepare(req(user="late"))
    nxt, _ = service.prepare(req(user="next"))
    now = store.server_now()
    for attempt in (late, nxt):
        attempt.create_holder()
        waiting.enqueue("res|global|*", attempt.ticket("global", now))
    waiter = service._Waiter(late, time.monotonic() + 10, time.monotonic())
    waiter.gate = waiting.read_gate("res|global|*")   # as it last saw the gate: its turn
    waiting.prune(waiter.gate, [late.token], reason="waiter-gone")
    # When: its wake-up arrives after a long wait, so it writes its holder again and books.
    late.created_at -= late.definition.ttl_seconds
    lease = waiter._try(woken=True)
    # Then: without a ticket it gets nothing; the waiter still queued keeps its turn.
    assert lease is None
    assert gate_doc()["holders"] == [held._booking()]
    assert queued_ids() == [nxt.token]
    held.release()


def test_given_a_stalled_waiter_booking_again_under_its_token_while_repair_checks_then_its_live_slot_stays(
        monkeypatch):
    # Given: a cap-1 gate booked by an attempt whose holder document vanished before it
    # was marked HELD (reaped while it stalled): an orphan entry, as repair will read it.
    put("res", "levels: {global: 1}\nwaitMs: 0")
    attempt, _ = service.prepare(req(user="w"))
    attempt.create_holder()
    assert slots.take(attempt.specs, attempt.booking, "res", gate_key=attempt.gate.key) == 1
    store.holders().delete_one({"_id": attempt.token})
    real_orphans, rebooked = slots.orphans, []

    def orphans_then_the_waiter_books_again(bookings, now, unclaimed=(), claiming=None):
        found = real_orphans(bookings, now, unclaimed, claiming)
        # Between repair's read and its pull, the waiter's _Vanished path: give back, write
        # the holder again under the same token, and (its turn) book again.
        attempt.give_back(attempt.keys)
        attempt.create_holder()
        rebooked.append(attempt.book(privileged=False, allow_queue=False))
        return found

    monkeypatch.setattr(slots, "orphans", orphans_then_the_waiter_books_again)
    # When: repair checks the gate and pulls what it found orphaned.
    gate = waiting.read_gate("res|global|*")
    waiting.repair(gate, gate["clock"])
    # Then: the live lease keeps its slot, and the cap holds.
    (lease,) = rebooked
    after = gate_doc()
    assert after["count"] == 1 and [entries.token_of(e) for e in after["holders"]] == [lease.token]
    with pytest.raises(leases.LeaseBusy):
        leases.acquire(req(user="newcomer"))
    lease.release()
    assert gate_doc()["count"] == 0


@pytest.mark.parametrize("extra", [
    "",
    # Weights, project weights, classes and a starvation bound cost no command: they ride in
    # the ticket and in the grant's own booking update.
    "\nshares: {tenants: {acme: 3}, projects: {p1: 2}}\npriorities: [hi, lo]\nmaxStarvationMs: 60000",
], ids=["equal-shares", "weights-and-classes"])
def test_contended_grant_command_budget(settings, extra):
    # Given: a full cap-1 resource. When: a waiter queues, the holder releases, the waiter
    # is granted and releases. Then: queueing 3 (holder, the refused push, the ticket),
    # release 4 (the gate read and the update that hands the slot over, the delete, the
    # tombstone), the granted waiter's own release 3 — its mark HELD was not due yet when
    # it released, so it was never sent (leases.engine.claims) — 10 in all (a keep-alive
    # more if the machine is slow enough for a poll to fall due).
    put("res", "levels: {global: 1}\nwaitMs: 10000" + extra)
    from leases.definitions import invalidation

    assert invalidation.wait_listening()
    leases.acquire(req(user="warm")).release()
    held = leases.acquire(req(user="h"))
    # The repair check of a full counter (a claim and a read, once per interval for all
    # processes) is not part of a grant: stamp it done for this test.
    settings.LEASES_REPAIR_INTERVAL_MS = 600000
    assert waiting.repair(gate_doc(), store.server_now()) is False
    with helpers.counted_commands(all_threads=True) as counter:  # the waiter runs in its own thread
        waiter = queue_up(req(user="w"))
        queued = len([c for c in counter.commands if c != "find"])  # queue_up's own reads
        held.release()
        waiter.join(10)
        assert waiter.lease is not None
        waiter.lease.release()
        work = [c for c in counter.commands if c != "find"]
    assert queued == 3, counter.commands
    assert 10 <= len(work) <= 11, work


def _child(code, **env):
    return subprocess.Popen([PYTHON, "-c", code], cwd=REPO, env=child_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


WAIT_CHILD = """
import django; django.setup()
import leases
from leases.revocation import handlers
class Q(handlers.LeaseHandler):
    type = "test"
    def on_revoked(self, holder): pass
handlers.register_handler(Q())
print("ready", flush=True)
leases.acquire(leases.LeaseRequest(type="test", lease="res", tenant_id="acme", project_id="p1",
                                   user_id="child", pod=""))
print("granted", flush=True)
"""


@contextmanager
def dead_waiter_first_in_line():
    """A child process that queued first and was then killed with ``kill -9``; yields its
    ticket id (its ticket stays fresh in the queue until its TTL says otherwise)."""
    child = _child(WAIT_CHILD)
    try:
        assert child.stdout.readline().strip() == "ready"
        dead = until(lambda: queued_ids() and queued_ids()[0])
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        yield dead
    finally:
        if child.poll() is None:
            child.kill()


def test_given_publish_reaches_nobody_while_the_waiters_keep_alive_then_none_is_dropped_and_they_keep_their_order(
        settings, monkeypatch):
    # Given: Redis just restarted and no subscriber is back yet: every PUBLISH reaches
    # nobody, though both waiters are alive and keep their tickets alive by their poll.
    settings.LEASES_WAIT_POLL_MS = 200
    monkeypatch.setattr(wakeups, "wake", lambda ticket_id, process, hint=None: wakeups.DEAD)
    put("res", "levels: {global: 1}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    first = queue_up(req(user="w1"))
    second = queue_up(req(user="w2"))
    # When: the holder releases (its hand-off hears "nobody received it" for both).
    held.release()
    first.join(10)
    # Then: neither was dropped as gone; the first in line is granted by its own poll, and
    # the second still waits with its ticket and holder document, next in line.
    assert first.lease is not None, first.error
    assert store.tombstones().count_documents({"reason": "waiter-gone"}) == 0
    assert queued_ids() == [second.ticket]
    assert store.holders().find_one({"_id": second.ticket})["state"] == "PENDING"
    first.lease.release()
    second.join(10)
    assert second.lease is not None
    assert store.tombstones().count_documents({"reason": "waiter-gone"}) == 0
    second.lease.release()


# The waiter above, with the engine's pause points armed (only test settings arm them).
# The child stays up once granted: its mark is sent after a share of the claim window.
PAUSING_WAIT_CHILD = WAIT_CHILD.replace(
    "import leases\n", "import leases\nfrom django.conf import settings; settings.LEASES_TEST_PAUSE_POINTS = True\n",
    1) + "import time; time.sleep(60)\n"


def _claim_bound_s() -> float:
    """A granted ticket's slot moves on within its claim bound (its process's heartbeat
    stops: sooner), then the next repair check of a waiter that polls ends its holder."""
    return (grants.claim_bound_ms() + waiting.repair_interval_ms() + waiting.poll_ms() * 1.25) / 1000 + 0.5


def _slot_moves_on(follower, since: float, unclaimed: str) -> None:
    """The next waiter gets the slot within the claim bound from ``since``, and the entry of
    the grant ``unclaimed`` never claimed is off the gate."""
    follower.join(10)
    assert follower.lease is not None
    assert time.monotonic() - since <= _claim_bound_s()
    gate = gate_doc()
    assert unclaimed not in [entries.token_of(e) for e in gate["holders"]] and gate["count"] == 1
    follower.lease.release()


def test_given_a_dead_waiter_first_in_line_without_wakeups_then_its_grant_moves_on_within_the_claim_window(
        settings, monkeypatch):
    # Without Redis nothing tells that the waiter's process is gone: the release grants it
    # its slot all the same, and the claim window takes the slot back.
    settings.LEASES_WAIT_POLL_MS = 200
    monkeypatch.setattr(wakeups, "wake", lambda ticket_id, process, hint=None: wakeups.UNKNOWN)
    put("res", "levels: {global: 1}\nwaitMs: 60000")
    held = leases.acquire(req(user="h"))
    with dead_waiter_first_in_line() as dead:
        follower = queue_up(req(user="follower"))
        released = time.monotonic()
        held.release()
        # The release booked the dead ticket's entry for it and dequeued it.
        assert [entries.token_of(e) for e in gate_doc()["holders"]] == [dead]
        assert dead not in queued_ids()
        follower.join(10)
        assert follower.lease is not None
        assert time.monotonic() - released <= _claim_bound_s()
        assert store.holders().find_one({"_id": dead}) is None  # its unclaimed holder was ended
        assert store.tombstones().find_one({"_id": dead}) is None  # never a lease: no tombstone
        gate = gate_doc()
        assert gate["count"] == 1 and [entries.token_of(e) for e in gate["holders"]] == [follower.lease.token]
        follower.lease.release()


@contextmanager
def child_granted_and_stopped_at_its_mark(settle_s: float = 0.0):
    """A waiter first in line in a child process, a follower behind it in this one, and a
    release that grants the child, whose mark then stops at its pause point (its lease is
    answered, not claimed); yields (child, its ticket, follower). ``settle_s``: how long the
    child waits before the follower queues."""
    put("res", "levels: {global: 1}\nwaitMs: 60000")
    held = leases.acquire(req(user="h"))
    child = _child(PAUSING_WAIT_CHILD, LEASES_TEST_PAUSE="claim")
    try:
        assert child.stdout.readline().strip() == "ready"
        ticket = until(lambda: queued_ids() and queued_ids()[0])
        time.sleep(settle_s)
        follower = queue_up(req(user="follower"))
        held.release()
        assert child.stderr.readline().startswith("LEASES-PAUSED claim")
        yield child, ticket, follower
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_given_a_waiter_killed_after_its_grant_and_before_it_claimed_then_the_next_gets_the_slot_in_bound(settings):
    # Given: a waiter first in line whose process stops right after its grant reached it.
    settings.LEASES_WAIT_POLL_MS = 200
    with child_granted_and_stopped_at_its_mark() as (child, dead, follower):
        # When: it is killed before its claim.
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        killed = time.monotonic()
        # Then: the next waiter gets the slot within the claim bound; the dead one's entry is gone.
        _slot_moves_on(follower, killed, dead)


def test_given_a_granted_waiter_whose_process_lives_but_is_slow_to_claim_then_repair_waits_up_to_the_claim_bound(
        settings):
    # Given: a waiter in a child process whose grant is answered and whose mark then stops,
    # while the process itself lives (its heartbeat goes on, written before the grant).
    settings.LEASES_WAIT_POLL_MS = 200
    with child_granted_and_stopped_at_its_mark(settle_s=presence.beat_period_s() * 1.5) as (_, slow, follower):
        granted = time.monotonic()
        # Then: past the claim window, and the repairs of the follower's process meanwhile,
        # the grant stands: a live process's waiter that is merely slow keeps its turn ...
        time.sleep((grants.claim_ms() + 2 * waiting.repair_interval_ms()) / 1000)
        assert [entries.token_of(e) for e in gate_doc()["holders"]] == [slow]
        assert store.holders().find_one({"_id": slow})["state"] == "PENDING"
        assert follower.lease is None
        # ... until the claim bound: then the slot moves on to the next.
        _slot_moves_on(follower, granted, slow)


@pytest.mark.parametrize("listening", [True, False])
def test_given_no_wake_up_can_reach_a_waiter_then_its_process_looks_within_the_claim_window(settings, monkeypatch,
                                                                                          listening):
    # With Redis down a slot handed to a ticket is claimed only by a look at the gate: a look
    # every 1 s poll let the 500 ms claim window pass, and another waiter's repair ended the
    # grant as unclaimed (the slot then idled until the next poll). The looks are the
    # process's watcher's (one read per gate for all its waiters).
    settings.LEASES_WAIT_POLL_MS = 1000
    monkeypatch.setattr(wakeups, "listening", lambda: listening)
    looks: list[float] = []
    real_look = watch.look

    def look(gate_key):
        looks.append(time.monotonic())
        return real_look(gate_key)

    monkeypatch.setattr(watch, "look", look)
    put("res", "levels: {global: 1}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    with pytest.raises(leases.LeaseBusy):
        leases.acquire(req(user="w", wait_ms=2600))
    held.release()
    gaps = sorted(b - a for a, b in zip(looks, looks[1:]))
    assert gaps, looks
    typical = gaps[len(gaps) // 2]  # the median: one late wake-up of a loaded machine is not the period
    if listening:  # woken by the grant's message: the look is only the safety net
        assert typical >= waiting.poll_ms() / 1000.0 * 0.9, gaps
    else:
        assert typical <= grants.claim_ms() / 1000.0 / 2 + 0.05, gaps


def test_given_this_processs_subscriber_is_subscribed_then_it_is_listening():
    wakeups.register("tk-listening")
    try:
        assert wait_for(wakeups.listening, timeout=5)
    finally:
        wakeups.unregister("tk-listening")


def test_given_threads_holding_the_same_state_of_a_full_gate_then_only_the_first_sends_a_repair_claim(settings):
    # Given: a full cap-1 gate checked before (a claim on record), as a batch of newcomers
    # all got it back.
    settings.LEASES_REPAIR_INTERVAL_MS = 1000
    put("res", "levels: {global: 1}\nwaitMs: 0")
    held = leases.acquire(req(user="h"))
    gate = waiting.read_gate("res|global|*")
    waiting.repair(gate, gate["clock"])
    time.sleep(1.05)
    gate = waiting.read_gate("res|global|*")
    try:
        with helpers.counted_commands() as counter:
            # When: one thread claims the check, then another decides on the same state.
            waiting.repair(gate, gate["clock"])
            first = len(counter.commands)
            waiting.repair(dict(gate), gate["clock"])
        # Then: the second sends nothing (a claim against the check the first replaced can
        # only lose); the first sent its claim.
        assert first >= 1 and len(counter.commands) == first, counter.commands
        assert waiting.first_look(gate) and not waiting.first_look(dict(gate))
    finally:
        held.release()
