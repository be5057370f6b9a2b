"""Liveness of waiting: one heartbeat per process keeps all of its tickets alive.

A ticket names the process that waits on it (``w``, its wake-up id). Each process with at
least one waiter writes one small document of its own, ``{_id: w, seen}`` in
``lease_presence``, every quarter of the ticket TTL (``seen`` is MongoDB's clock); a ticket
is as alive as the later of its own ``seen`` (written when it was queued) and its
process's heartbeat. So the store's cost of keeping tickets alive grows with the number of
waiting processes, not of waiting requests, and nothing is written to the gate while a
request waits. A process paused or killed misses its heartbeats: all its tickets go stale
together, within the ticket TTL, as a single waiter's did.

A ticket kept for an HTTP client (no process waits on it) is alive while its client polls:
each poll moves its holder's deadline (``expiresAt``) on by the poll bound, so its last
keep-alive is that deadline minus its TTL; no heartbeat of its own is written.

Whoever runs the order rule looks the heartbeats up through a per-process cache
(:func:`seen_of`), refreshed at most every fifth of the ticket TTL, with one ``find`` for
all the processes and kept tickets it does not know fresh: a beat every quarter TTL seen
through a cache a fifth TTL old is under half a TTL old, so a live process's tickets are
never judged suspect, let alone stale.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime, timedelta
from typing import Any, cast

import pymongo.errors

from ..conf import lease_settings
from ..store import client as store, ticket_commands
from ..store.documents import CounterDoc, TicketDoc

log = logging.getLogger(__name__)

_lock = threading.Lock()
# Waiters of this process that need its heartbeat: handle -> monotonic time their first
# beat is due.
_entered: dict[int, float] = {}
_handles = 0
_wanted = threading.Condition(_lock)
_thread: threading.Thread | None = None
_thread_pid: int | None = None
_beats = 0  # heartbeats written by this process (tests and benches read it)

# Process id or kept ticket id → (last keep-alive on MongoDB's clock or None, monotonic time
# it was read). A kept ticket is keyed by its id (``k:`` prefix).
_cache: dict[str, tuple[datetime | None, float]] = {}
_asked: dict[str, float] = {}  # key -> monotonic time a decision last looked it up
# The process keys of ``_asked`` alone (a few, one per live process): a gate read scans them
# for the heartbeats to bring along, and a web process may also have asked about thousands
# of kept tickets, which a gate read never brings.
_asked_processes: dict[str, float] = {}
_cache_lock = threading.Lock()
CACHE_LIMIT = 10_000
KEPT = "k:"


def ttl_ms() -> int:
    return int(lease_settings.TICKET_TTL_MS)


def beat_period_s() -> float:
    """How often a process with waiters writes its heartbeat: a quarter of the ticket TTL."""
    return max(0.05, ttl_ms() / 4000.0)


def refresh_s() -> float:
    """How old a heartbeat read may be before a reader reads it again: a fifth of the TTL."""
    return max(0.04, ttl_ms() / 5000.0)


def enter(waker: str, *, first_beat_s: float | None = None) -> int:
    """A waiter of this process (wake-up id ``waker``) starts waiting: make sure the process
    beats for it (the first waiter starts the thread, fork-aware). Pair with :func:`leave`,
    passing what this returns.

    The waiter's ticket is born alive (its own ``seen``), so the process's first beat for it
    is due a beat period after it entered (``first_beat_s``: sooner) — a process whose
    requests wait less than that never writes one.
    """
    global _thread, _thread_pid, _handles
    with _lock:
        if _thread_pid != os.getpid():
            _entered.clear()
            _thread = None
        _handles += 1
        handle = _handles
        _entered[handle] = time.monotonic() + (beat_period_s() if first_beat_s is None else first_beat_s)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, args=(waker,), name="lease-presence", daemon=True)
            _thread_pid = os.getpid()
            _thread.start()
        _wanted.notify_all()
    return handle


def leave(handle: int) -> None:
    """The waiter that :func:`enter` answered ``handle`` stopped waiting; when none is left
    the heartbeat rests."""
    with _lock:
        _entered.pop(handle, None)


def beats() -> int:
    """How many heartbeats this process wrote so far."""
    return _beats


def beat(waker: str) -> None:
    """Write this process's heartbeat now (one upsert of its own small document).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    global _beats
    store.presence().update_one({"_id": waker}, {"$currentDate": {"seen": True}}, upsert=True)
    _beats += 1


def _run(waker: str) -> None:
    last = float("-inf")
    while True:
        with _lock:
            while not _entered:
                _wanted.wait()
            # Every waiter needs a keep-alive a period after its own or the last beat, so
            # the next beat is due a period after the last one, but not before the
            # earliest first beat a waiter here needs.
            due = max(last + beat_period_s(), min(_entered.values())) - time.monotonic()
            if due > 0:
                # On the condition, not asleep: a new waiter (enter) wakes it, so a period
                # changed meanwhile (the TTL setting) takes effect at once.
                _wanted.wait(due)
                continue
        # A beat that failed is tried again after a fifth of a period, not a whole one.
        last = time.monotonic() - (0.0 if beat_once(waker) else beat_period_s() * 0.8)


def beat_once(waker: str) -> bool:
    """Write this process's heartbeat under the store's bound; whether it landed. Never raises.

    The store's bound, not a beat period: under load a beat waits its turn at the store, and
    one given up after a period would leave every ticket of this process a period older, again
    and again, until the readers drop them as stale. A missed beat costs liveness only if
    the outage outlasts the TTL; the waiters notice their tickets pruned and queue again.
    """
    try:
        with pymongo.timeout(int(lease_settings.MONGO_TIMEOUT_MS) / 1000.0):
            beat(waker)
        return True
    except pymongo.errors.PyMongoError as exc:
        log.info("presence heartbeat failed (%s)", exc)
        return False


def key_of(ticket: TicketDoc) -> str | None:
    """Whose keep-alive keeps ``ticket``: its process (``w``), or for a kept ticket (no
    process, a TTL of its own) its holder; None for a ticket that names neither."""
    waker = ticket.get("w")
    if isinstance(waker, str) and waker:
        return waker
    token = ticket.get("id")
    return f"{KEPT}{token}" if isinstance(token, str) and token else None


def _needs(ticket: TicketDoc, key: str, mono: float, now: datetime | None) -> str:
    """Whether a lookup of ``key`` may use the cache as it is ("fresh"), should refresh it in
    the background ("later": a decision on a release's critical path must not wait for a
    read), or must read now ("now")."""
    own = ticket.get("seen") or ticket.get("at")
    if now is not None and isinstance(own, datetime) and own >= now:
        # Seen at or after the decision's clock: nothing a read could add. (The wait estimate's
        # walk makes such tickets — the holders that ask again, and copies kept alive for the
        # walk — and a read of their keys, unknown to the store, would be a command a grant.)
        return "fresh"
    with _cache_lock:
        known = _cache.get(key)
        _asked[key] = mono
        if not key.startswith(KEPT):
            _asked_processes[key] = mono
    if known is not None and mono - known[1] < refresh_s():
        # Read within a fifth of the TTL: a live process beats every quarter, so what was
        # read then keeps its tickets short of suspect.
        return "fresh"
    # Older, or never read: a newer read can only show the ticket more alive. So when what is
    # known already keeps it short of suspect (its own ``seen``, a young ticket's, or an older
    # beat), the decision stands — and the read is done in the background once the ticket is
    # half-way there; else read now.
    beat = known[0] if known is not None else None
    if key.startswith(KEPT):
        beat = _kept_seen(ticket, beat)
    latest = max((t for t in (own, beat) if isinstance(t, datetime)), default=None)
    if now is None or latest is None:
        return "now"
    ttl = timedelta(milliseconds=int(ticket.get("ttl") or 0))
    if latest + ttl / 4 > now:
        # Short of suspect for another quarter TTL by what is known: no read yet (a queue
        # whose waits are short never reads a heartbeat).
        return "fresh"
    return "later" if latest + ttl / 2 > now else "now"


def seen_of(ticket: TicketDoc, now: datetime | None = None) -> datetime | None:
    """The last keep-alive of ``ticket`` by its process's heartbeat or its client's poll
    (MongoDB's clock), from the cache; None when none is known. ``now``: MongoDB's clock of
    the decision (a young ticket's heartbeat is then read in the background). Never raises: a
    failed read keeps what was known (the ticket's own ``seen`` then decides)."""
    key = key_of(ticket)
    if key is None:
        return None
    mono = time.monotonic()
    need = _needs(ticket, key, mono, now)
    if need == "now":
        _refresh_keys({key})
    elif need == "later":
        _later({key})
    with _cache_lock:
        known = _cache.get(key)
    seen = known[0] if known else None
    return _kept_seen(ticket, seen) if key.startswith(KEPT) else seen


def read_lately(ticket: TicketDoc) -> bool:
    """Whether what this process knows of ``ticket``'s keep-alive was read within two
    refresh periods (a ticket that names no process has only its own ``seen``: True). A
    ticket is dropped as stale only on such knowledge: a read that failed or was skipped
    (the store slow under load) must not drop a live process's tickets."""
    key = key_of(ticket)
    if key is None:
        return True
    with _cache_lock:
        known = _cache.get(key)
    return known is not None and time.monotonic() - known[1] < 2 * refresh_s()


def prefetch(tickets: list[TicketDoc], now: datetime | None = None) -> None:
    """Read, in one go, the keep-alives of ``tickets`` the cache does not know fresh (the
    order rule asks for all the tickets of a gate: one command instead of one per process);
    those that can wait (see :func:`seen_of`) in the background."""
    mono = time.monotonic()
    needs: dict[str, set[str]] = {"now": set(), "later": set(), "fresh": set()}
    for ticket in tickets:
        key = key_of(ticket)
        if key is not None:
            needs[_needs(ticket, key, mono, now)].add(key)
    if needs["now"]:
        _refresh_keys(needs["now"])
    if needs["later"]:
        _later(needs["later"])


_pending: set[str] = set()
_reader: threading.Thread | None = None
#: The background reader's thread name (command counts put it with the per-process work).
READER = "lease-presence-read"


def _later(keys: set[str]) -> None:
    """Have the background reader refresh ``keys`` (one thread, started when needed)."""
    global _reader
    with _cache_lock:
        _pending.update(keys)
        if _reader is not None and _reader.is_alive():
            return
        _reader = threading.Thread(target=_read_pending, name=READER, daemon=True)
        _reader.start()


def _read_pending() -> None:
    while True:
        with _cache_lock:
            keys = set(_pending)
            _pending.clear()
        if not keys:
            return
        _refresh_keys(keys)


def _kept_seen(ticket: TicketDoc, deadline: datetime | None) -> datetime | None:
    # A kept ticket's holder deadline is its last poll plus the poll bound (its ``ttl``).
    if deadline is None:
        return None
    return deadline - timedelta(milliseconds=int(ticket.get("ttl") or 0))


def _aging(now: float) -> set[str]:
    """The cached keys half-way to a refresh: read with the ones due, so that one read a
    refresh period serves them all. (Read only when due, each key would keep the moment of
    its first read, and a process deciding often would read a few keys at a time, one
    command each, many times a period.) Trims the cache to :data:`CACHE_LIMIT`."""
    with _cache_lock:
        if len(_cache) > CACHE_LIMIT:
            for k in sorted(_cache, key=lambda k: _cache[k][1])[: len(_cache) - CACHE_LIMIT // 2]:
                _cache.pop(k, None)
                _asked.pop(k, None)
                _asked_processes.pop(k, None)
        # Only keys still asked about: a gone process's or a granted ticket's stays cached
        # (until trimmed) but is not read again.
        recent = now - 2 * refresh_s()
        return {k for k, (_, at) in _cache.items() if now - at >= refresh_s() / 2 and _asked.get(k, 0.0) >= recent}


_read_lock = threading.Lock()


def _refresh_keys(due: set[str]) -> None:
    """Read the keys of ``due`` not read since a half refresh period, and the cached keys
    half-way to a refresh (:func:`_aging`), in one command per collection."""
    # One read at a time per process: the threads of a web process deciding at once would
    # each read the same keys; those that waited read only what the read before left stale.
    # Waiting for another thread's read is bounded by one read's bound: a store that does not
    # answer must not queue the deciders behind each other (what was known then decides).
    if not _read_lock.acquire(timeout=_read_bound_s()):
        return
    try:
        mono = time.monotonic()
        with _cache_lock:
            due = {k for k in due if k not in _cache or mono - _cache[k][1] >= refresh_s() / 2}
        if due:
            _read_now(due | _aging(mono))
    finally:
        _read_lock.release()


def _read_bound_s() -> float:
    return max(0.5, refresh_s())


def _read_now(due: set[str]) -> None:
    processes = [k for k in due if not k.startswith(KEPT)]
    kept = [k[len(KEPT):] for k in due if k.startswith(KEPT)]
    found: dict[str, datetime | None] = dict.fromkeys(due)
    try:
        with pymongo.timeout(_read_bound_s()):
            if processes:
                for doc in store.presence().find({"_id": {"$in": processes}}, {"seen": 1}):
                    found[str(doc["_id"])] = doc.get("seen")
            if kept:
                for doc in store.holders().find({"_id": {"$in": kept}, "state": "PENDING"}, {"expiresAt": 1}):
                    found[f"{KEPT}{doc['_id']}"] = doc.get("expiresAt")
    except pymongo.errors.PyMongoError as exc:
        log.info("presence read failed (%s); tickets are judged by their own keep-alive", exc)
        return
    _remember(found)


def _remember(found: dict[str, datetime | None]) -> None:
    """Cache what a read just answered for each key it asked (None: no keep-alive found)."""
    stamp = time.monotonic()
    with _cache_lock:
        for k, seen in found.items():
            _cache[k] = (seen, stamp)


#: The most heartbeats a gate read brings along (:func:`read_gate`).
ALONG_LIMIT = 64


def _soon(mono: float) -> list[str]:
    """Process keys this process will likely look up at its next decision and would read
    first: asked about recently (within four refresh periods) and not read within half a
    period. Kept tickets' keys are left out (their deadlines are on the holders); keys not
    asked about within those periods are dropped here, so the scan stays as long as the
    processes a decision looks up."""
    recent = mono - 4 * refresh_s()
    with _cache_lock:
        for k in [k for k, at in _asked_processes.items() if at < recent]:
            del _asked_processes[k]
        keys = [k for k in _asked_processes if k not in _cache or mono - _cache[k][1] >= refresh_s() / 2]
    return keys[:ALONG_LIMIT]


def read_gate(gate_key: str) -> CounterDoc | None:
    """The gate ``gate_key`` with ``clock`` (MongoDB's time now), read with the heartbeats
    this process's next decision on it will likely need (:func:`_soon`) in the same
    command: a release's hand-off then decides without a read of its own on its path.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    keys = _soon(time.monotonic())
    docs = list(store.counters().aggregate(ticket_commands.read_with_clock(gate_key, beats=keys)))
    gate = docs[0] if docs and docs[0].get("_id") == gate_key else None
    if keys:
        found: dict[str, datetime | None] = dict.fromkeys(keys)
        for doc in docs:
            if doc is not gate and doc.get("_id") in found:
                found[str(doc["_id"])] = doc.get("seen")
        _remember(found)
    return cast("CounterDoc | None", gate)


def note_kept(ticket_id: str, deadline: datetime) -> None:
    """A poll of the kept ticket ``ticket_id`` just moved its holder's deadline to
    ``deadline``: what this process knows of it is that, as of now (its own answer then
    names the deadline it set, not one a reader cached before it)."""
    with _cache_lock:
        _cache[f"{KEPT}{ticket_id}"] = (deadline, time.monotonic())


def forget() -> None:
    """Drop what this process knows of heartbeats (tests that change the clock's view)."""
    with _cache_lock:
        _cache.clear()
        _asked.clear()
        _asked_processes.clear()


def sweep_filter(before: datetime) -> dict[str, Any]:
    """The heartbeat documents not written since ``before`` (processes gone: the sweep
    deletes them)."""
    return {"seen": {"$lt": before}}
