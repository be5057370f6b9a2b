"""One look at each gate per process: the waiters of a process share its reads of their gates.

A waiter sleeps until it is woken: by a release (over Redis, :mod:`leases.queue.wakeups`)
or by this process's watcher. The watcher is one thread per process; every poll period it
reads each gate that has waiters here (one read, never a write: nothing is written to a
gate because requests wait on it), and on what it read does what each waiter's own poll
used to: drop stale tickets, hand free slots to whoever's turn it is (waking them, here or
in other processes), check a full gate's entries (repair). A local ticket that is no longer
queued (granted while its wake-up was lost, or dropped) has its waiter nudged to look.

So the store sees one read per gate and process per period, whatever the number of waiters,
and the waiters' safety poll is the watcher's: a lost wake-up costs at most one period.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time

import pymongo.errors

from ..store.documents import CounterDoc
from . import backlog, grants, order, waiting, wakeups

log = logging.getLogger(__name__)

_lock = threading.Lock()
_wanted = threading.Condition(_lock)
_gates: dict[str, set[str]] = {}  # gate key -> ticket ids waiting here
_latest: dict[str, tuple[CounterDoc, float]] = {}  # gate key -> (last read, monotonic time)
# Gate key -> monotonic time it began to be watched: its waiter decides on the gate its own
# enqueue returns, so the watcher's first look is due a period later, not at once (a process
# whose one waiter waits again after each grant would read the gate once a grant).
_since: dict[str, float] = {}
_thread: threading.Thread | None = None
_thread_pid: int | None = None
_reads = 0  # gate reads by this process's watcher (benches read it)


def period_s() -> float:
    """The watcher's period: the waiters' poll (``LEASES_WAIT_POLL_MS``, jittered); with no
    wake-up reaching this process (Redis down) within half the claim window, so a slot
    handed to a ticket here is claimed before another process's repair ends it unclaimed."""
    period = waiting.poll_ms() / 1000.0 * random.uniform(1.0, 1.25)
    if not wakeups.listening():
        period = min(period, grants.claim_ms() / 1000.0 * random.uniform(0.4, 0.5))
    return period


def add(gate_key: str, ticket_id: str) -> None:
    """Watch ``gate_key`` for the waiter of ``ticket_id`` (starts the thread, fork-aware)."""
    global _thread, _thread_pid
    with _lock:
        if _thread_pid != os.getpid():
            _gates.clear()
            _latest.clear()
            _since.clear()
            _thread = None
        if gate_key not in _gates:
            _since[gate_key] = time.monotonic()
        _gates.setdefault(gate_key, set()).add(ticket_id)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="lease-watch", daemon=True)
            _thread_pid = os.getpid()
            _thread.start()
        _wanted.notify_all()


def remove(gate_key: str, ticket_id: str) -> None:
    """The waiter of ``ticket_id`` stopped waiting on ``gate_key``."""
    with _lock:
        waiters = _gates.get(gate_key)
        if waiters is not None:
            waiters.discard(ticket_id)
            if not waiters:
                _gates.pop(gate_key, None)
                _latest.pop(gate_key, None)
                _since.pop(gate_key, None)


def note(gate: CounterDoc | None) -> None:
    """Keep ``gate`` (as a command of this process returned it, with its ``clock``) as the
    latest look at it, when it is watched."""
    if gate is None or gate.get("clock") is None:
        return
    with _lock:
        if gate["_id"] in _gates:
            _latest[gate["_id"]] = (gate, time.monotonic())


def latest(gate_key: str, max_age_s: float) -> CounterDoc | None:
    """The watcher's last look at ``gate_key`` if it is at most ``max_age_s`` old, else None."""
    with _lock:
        seen = _latest.get(gate_key)
    if seen is None or time.monotonic() - seen[1] > max_age_s:
        return None
    return seen[0]


def reads() -> int:
    """Gate reads this process's watcher made so far."""
    return _reads


def look(gate_key: str) -> CounterDoc | None:
    """Read the gate for the waiters here, act on it, and nudge the waiters whose tickets
    left the queue. Never raises (a failed read is retried next period).

    Returns:
        The gate as read, or None.
    """
    global _reads
    with _lock:
        # Who waits here before the read and after it: a waiter that ended, or began,
        # meanwhile is in one of them, so its ticket is never taken for an orphan.
        before = set(_gates.get(gate_key) or ())
    try:
        gate = waiting.read_gate(gate_key)
        _reads += 1
    except pymongo.errors.PyMongoError as exc:
        log.info("watcher: reading %s failed (%s)", gate_key, exc)
        return None
    if gate is None:
        return None
    note(gate)
    try:
        gate = act(gate)
    except pymongo.errors.PyMongoError as exc:
        log.info("watcher: acting on %s failed (%s)", gate_key, exc)
    with _lock:
        mine = set(_gates.get(gate_key) or ())
    orphans = orphans_of(gate, mine | before)
    if orphans:
        # Tickets of this process that no waiter here waits on (a waiter whose store step
        # failed after it queued): its heartbeat would keep them alive, first in line for
        # ever. Dropped like a dead waiter's.
        try:
            gate = waiting.prune(gate, orphans, reason="waiter-gone")
        except pymongo.errors.PyMongoError as exc:
            log.info("watcher: dropping orphans on %s failed (%s)", gate_key, exc)
    queued = {t.get("id") for t in gate.get("queue") or ()}
    absent = sorted(mine - queued)
    try:
        # Ours placed in the backlog wait there: check they still do (promoted ones are in
        # the head by now, or granted; dropped ones must queue again).
        waiting_back = backlog.verify(gate_key, absent, lambda: waiting.read_gate(gate_key), gate)
    except pymongo.errors.PyMongoError as exc:
        log.info("watcher: reading the backlog of %s failed (%s)", gate_key, exc)
        return gate
    for token in absent:
        if token not in waiting_back:
            wakeups.nudge(token)
    return gate


def orphans_of(gate: CounterDoc, waiting_here: set[str]) -> list[str]:
    """The ids of ``gate``'s head tickets this process's heartbeat keeps alive (their ``w``
    is this process) but no waiter here waits on (``waiting_here``: waiters are watched before
    they queue, so a ticket being queued is never one)."""
    me = wakeups.process_id()
    return [str(t["id"]) for t in gate.get("queue") or () if t.get("w") == me and t.get("id") not in waiting_here]


def act(gate: CounterDoc) -> CounterDoc:
    """What a waiter's poll did on the gate as read, once for the process: drop stale
    tickets, hand free slots on, check the entries of a gate that blocks everyone.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    now = gate["clock"]
    with _lock:
        ours_back = any(backlog.placed(t, gate["_id"]) for t in _gates.get(gate["_id"]) or ())
    if backlog.due(gate) or (ours_back and len(gate.get("queue") or ()) <= backlog.head_limit() // 2):
        # The head emptied to half (or we placed tickets the gate does not count: a writer
        # died between its two commands): promote from the backlog.
        gate = backlog.safe_promote(gate, force=ours_back) or gate
        note(gate)
    if order.stale_ids(gate, now):
        gate = waiting.prune(gate)
        note(gate)
    picked = waiting.hand_off(gate)
    if (not picked or grants.unclaimed(gate, now)) and waiting.repair(gate, now):
        fresh = waiting.read_gate(gate["_id"])
        if fresh is not None:
            note(fresh)
            waiting.hand_off(fresh)
            gate = fresh
    return gate


def _run() -> None:
    while True:
        with _lock:
            while not _gates:
                _wanted.wait()
            keys = list(_gates)
        period = period_s()
        for key in keys:
            # A gate a command of this process returned within the period (a waiter's
            # enqueue, a release here), or watched for less than a period, needs no look yet.
            if latest(key, period) is None and not _new(key, period):
                try:
                    look(key)
                except Exception:  # noqa: BLE001 - the process's only watcher must outlive any bug
                    log.exception("watcher: looking at %s failed", key)
        pause = min(period, _next_due(keys, period))
        with _lock:
            # A new gate to watch (add) wakes the loop early: it then looks at it within its
            # period, not after the rest of a sleep computed before.
            _wanted.wait(pause)


def _new(key: str, period: float) -> bool:
    """Whether ``key`` began to be watched less than ``period`` ago."""
    with _lock:
        since = _since.get(key)
    return since is not None and time.monotonic() - since < period


def _next_due(keys: list[str], period: float) -> float:
    """Seconds until the first of ``keys`` is due for a look (at least 20 ms): a period after
    its last look, or after it began to be watched."""
    now = time.monotonic()
    with _lock:
        seen = [max(_latest[k][1] if k in _latest else 0.0, _since.get(k, 0.0)) for k in keys]
    return max(0.02, period - max((now - at for at in seen), default=0.0))
