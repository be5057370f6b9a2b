"""The backlog: the tickets of a long queue beyond its gate's head, one document each.

The gate counter is the resource's hottest document: every booking, release and hand-off
rewrites it, and a document's cost to the store grows with its size (on the embedded server
a write costs about 20 µs more per ticket it holds). So the gate holds only the head of the
queue — at most ``LEASES_QUEUE_HEAD`` tickets (32) — and the order rule decides among them;
a request that finds the head full, or older tickets already in the backlog, waits in
``lease_tickets`` (``{_id: ticket id, g: gate key, at: arrival, ticket}``), and the gate
counts them (``bk``). Every decision on the gate then costs the same with 1,000 waiters as
with 32.

Whoever looks at a gate whose head has emptied to half (a process's watcher, a release's
hand-off) promotes tickets from the backlog into the head: one claim on the gate
(``promotedAt``, so one promoter at a time), one read of the backlog, one delete and one push.
The tickets promoted are those the order rule would pick next: within each lane (tenant,
project, class, and user when the user is capped) the oldest, ranked by the rule with the
head — so a tenant arriving behind another's thousand tickets is in the head at the next
promotion, not after them. Stale tickets found there (their process stopped beating) are
dropped like the gate's, holders and tombstones included.

The bound: the gate holds at most the head limit of tickets; the backlog, with the head, at
most ``LEASES_QUEUE_LIMIT`` (a newcomer beyond is Busy at once); a promotion reads at most
that many small documents, once per half a head of grants.

A waiter of this process placed in the backlog is remembered here (:func:`placed`) so that
it does not take its absence from the gate for a grant or a drop; this process's watcher
checks those tickets still exist (:func:`verify`) and forgets the ones promoted or dropped.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pymongo.errors
from pymongo import ReplaceOne, ReturnDocument

from ..conf import lease_settings
from ..store import batches, client as store, shapes, ticket_commands as commands
from ..store.documents import CounterDoc, TicketDoc
from ..store.tombstones import ticket_tombstones
from . import order

log = logging.getLogger(__name__)

#: The least time between two promotions on one gate (the claim's throttle).
PROMOTE_EVERY = timedelta(milliseconds=100)
#: The gate's field that says a promotion is under way (set by its claim, unset at its end).
PROMOTING = "promoting"


def promotion_bound() -> timedelta:
    """The longest a promotion moves its tickets (from its claim to its push): twice the store
    bound, as a release's hand-off runs it within its own."""
    return timedelta(milliseconds=2 * int(lease_settings.MONGO_TIMEOUT_MS))

_lock = threading.Lock()
_placed: dict[str, str] = {}  # ticket id -> gate key: this process's tickets in a backlog
_missing: dict[str, float] = {}  # ticket id -> monotonic time it was first found moving (see verify)
# gate key -> (its promotedAt when no promotion was under way, this process's tickets found there)
_verified: dict[str, tuple[Any, frozenset[str]]] = {}


def head_limit() -> int:
    """The most tickets a gate's queue holds in the gate document (``LEASES_QUEUE_HEAD``)."""
    return max(2, int(lease_settings.QUEUE_HEAD))


def count(gate: CounterDoc | None) -> int:
    """The tickets the gate counts in its backlog (``bk``)."""
    value = (gate or {}).get("bk")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def placed(ticket_id: str, gate_key: str | None = None) -> bool:
    """Whether this process placed ``ticket_id`` in a backlog (of ``gate_key``) and has not
    seen it promoted or dropped yet."""
    with _lock:
        where = _placed.get(ticket_id)
    return where is not None and (gate_key is None or where == gate_key)


def forget(ticket_id: str) -> None:
    with _lock:
        _placed.pop(ticket_id, None)
        _missing.pop(ticket_id, None)


def add(gate: CounterDoc, ticket: TicketDoc) -> CounterDoc | None:
    """Place ``ticket`` in the backlog of ``gate`` (idempotent: a ticket already there is
    written again) and count it on the gate; returns the gate as it is now (with its
    ``clock``), or None when the gate document does not exist (``gate`` may be a stand-in
    naming only its key, from a process's hint that the backlog is in use): then the ticket is
    not left placed, and the caller creates the gate.

    The threads of a process that place tickets on one gate at once share the commands
    (:mod:`leases.store.batches`): one write of all their tickets and one count on the gate.

    Raises:
        pymongo.errors.PyMongoError: the store failed (the ticket may be placed and not
            counted: promotion counts again), or the batch ahead of it did not end in time.
    """
    key = gate["_id"]
    doc = {"_id": ticket["id"], "g": key, "at": ticket.get("at"), "ticket": dict(ticket)}
    after = batches.combine(("backlog", key), ticket["id"], doc, lambda docs: dict.fromkeys(docs, _place(key, docs)))
    return copy.deepcopy(after)  # each caller its own: a waiter keeps and updates what it decides on


def _place(key: str, docs: dict[str, dict[str, Any]]) -> CounterDoc | None:
    """Write ``docs`` (tickets of the backlog of gate ``key``) and count the new ones on the
    gate; the gate after, or None when it does not exist (then the tickets are taken out)."""
    ids = list(docs)
    result = store.tickets().bulk_write([ReplaceOne({"_id": i}, docs[i], upsert=True) for i in ids], ordered=False)
    created = len(result.upserted_ids or {})
    with _lock:
        for ticket_id in ids:
            _placed[ticket_id] = key
    if not created:  # all placed before (their waiters queue again): counted already
        found = list(store.counters().aggregate(commands.read_with_clock(key)))
        after = found[0] if found else None
    else:
        after = store.counters().find_one_and_update(
            {"_id": key}, {"$inc": {"bk": created}, "$currentDate": {"clock": True}},
            return_document=ReturnDocument.AFTER)
    if after is None:
        # No gate (deleted since the hint, or never made): a ticket placed for it would be
        # counted nowhere and promoted by nobody.
        for ticket_id in ids:
            forget(ticket_id)
        store.tickets().delete_many({"_id": {"$in": ids}, "g": key})
    return after


def get(ticket_id: str, gate_key: str) -> dict[str, Any] | None:
    """``ticket_id``'s backlog document on ``gate_key``, None when it does not wait there.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    return store.tickets().find_one({"_id": ticket_id, "g": gate_key})


def remove(gate_key: str, ticket_id: str) -> bool:
    """Take ``ticket_id`` out of the backlog of ``gate_key``; True when it was there (then
    nobody can promote or grant it any more).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    forget(ticket_id)
    if not store.tickets().delete_one({"_id": ticket_id, "g": gate_key}).deleted_count:
        return False
    store.counters().update_one({"_id": gate_key, "bk": {"$gt": 0}}, {"$inc": {"bk": -1}})
    return True


def keep_for_polls(gate_key: str, ticket_id: str, ttl_ms: int) -> bool:
    """A ticket in the backlog kept for an HTTP client: its TTL the poll bound, no process
    waiting on it (as :func:`leases.store.ticket_commands.keep_alive` does in the head).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    forget(ticket_id)
    return bool(store.tickets().update_one({"_id": ticket_id, "g": gate_key},
                                           {"$set": {"ticket.ttl": int(ttl_ms), "ticket.w": None}}).matched_count)


def verify(gate_key: str, ticket_ids: list[str], fresh_gate: Callable[[], CounterDoc | None],
           gate: CounterDoc | None = None) -> set[str]:
    """Of this process's tickets it placed in the backlog of ``gate_key``, forget those that
    are not there any more (promoted, or dropped as stale); returns the ones still there — and
    those a promotion is moving right now.

    A promotion deletes its tickets from the backlog and then pushes them into the head: in
    between, a ticket is in neither. Forgotten then, its waiter would read the gate, find
    itself nowhere and queue again — a second ticket under its token, granted later to an
    attempt that is over (a slot idle for the claim window, every time). So when tickets are
    missing, the gate is read again (``fresh_gate``, one command): those in its head were
    promoted; those in neither while a promotion may still be under way (claimed within
    :func:`promotion_bound`) are kept until it has ended, at most that long.

    ``gate``: the gate as the caller just read it. Tickets leave a backlog only by a promotion
    (which moves ``promotedAt``) or by this process's own waiters: when no promotion began
    since the last check found them all there, no read is needed (1,000 waiters that wait
    for minutes then cost no backlog read a period).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    mine = [t for t in ticket_ids if placed(t, gate_key)]
    if not mine:
        return set()
    mark = None if gate is None or gate.get(PROMOTING) else ("promotedAt", gate.get("promotedAt"))
    with _lock:
        last = _verified.get(gate_key)
    if mark is not None and last is not None and last[0] == mark and last[1].issuperset(mine):
        return set(mine)
    # At most one per id asked: with the limit (and a first batch that size) the store
    # answers them all in one reply, not a find and a getMore past 101.
    there = {d["_id"] for d in store.tickets().find({"_id": {"$in": mine}, "g": gate_key}, {"_id": 1})
             .batch_size(len(mine)).limit(len(mine))}
    missing = set(mine) - there
    if not missing:
        if mark is not None:
            with _lock:
                _verified[gate_key] = (mark, frozenset(there))
        return there
    fresh = fresh_gate()
    head = {t.get("id") for t in (fresh or {}).get("queue") or ()}
    moving = set()
    now = time.monotonic()
    for ticket_id in missing:
        if ticket_id not in head and fresh is not None and promoting(fresh):
            with _lock:
                since = _missing.setdefault(ticket_id, now)
            if now - since < promotion_bound().total_seconds():
                moving.add(ticket_id)
                continue
        forget(ticket_id)
    return there | moving


def promoting(gate: CounterDoc) -> bool:
    """Whether a promotion claimed on ``gate`` (as read, with its ``clock``) may still be
    moving tickets from the backlog into the head."""
    claimed, now = gate.get("promotedAt"), gate.get("clock")
    return isinstance(claimed, datetime) and isinstance(now, datetime) and claimed > now - promotion_bound()


def due(gate: CounterDoc) -> bool:
    """Whether ``gate``'s head has emptied to half while its backlog holds tickets."""
    return count(gate) > 0 and len(gate.get("queue") or ()) <= head_limit() // 2


def _lane(ticket: TicketDoc) -> tuple[Any, ...]:
    caps = ticket.get("caps") or {}
    return (shapes.tenant(ticket), shapes.project(ticket), shapes.priority_rank(ticket),
            shapes.user(ticket) if "user" in caps else "")


def promote(gate: CounterDoc, *, force: bool = False) -> CounterDoc | None:
    """Move the tickets the order rule picks next from the backlog into the gate's head
    (see the module's text); ``force``: also when the gate's count says the backlog is empty
    (a process knows it placed tickets there). Never more than one promoter per gate at a
    time and per :data:`PROMOTE_EVERY`.

    Returns:
        The gate after the promotion, or None when nothing was promoted.

    Raises:
        pymongo.errors.PyMongoError: the store failed (tickets taken out of the backlog and
            not pushed are put back; if that fails too their waiters queue again).
    """
    now: datetime | None = gate.get("clock")
    room = head_limit() - len(gate.get("queue") or ())
    if now is None or room <= 0 or not (due(gate) or force):
        return None
    claimed, busy = gate.get("promotedAt"), gate.get(PROMOTING)
    if isinstance(claimed, datetime) and claimed > now - (promotion_bound() if busy else PROMOTE_EVERY):
        # Promoted lately, or a promotion is under way (until it ends, or its bound passes:
        # its promoter died). Two at once would both read the same tickets, and the one whose
        # push came second would put them back in the backlog — or push them again after a
        # grant took them from the head: a ticket twice, granted the second time to a waiter
        # that is gone (its slot idle for the claim window).
        return None
    if not store.counters().update_one({"_id": gate["_id"], "promotedAt": claimed, PROMOTING: busy},
                                       {"$currentDate": {"promotedAt": True}, "$set": {PROMOTING: True}}).matched_count:
        return None  # another process promotes right now
    after = None
    try:
        after = _promote(gate, now, room)
        return after
    finally:
        if after is None:
            # Its end, when no push said so: the next promotion may begin (a failure here
            # leaves it to the bound).
            try:
                store.counters().update_one({"_id": gate["_id"], PROMOTING: True}, {"$unset": {PROMOTING: ""}})
            except pymongo.errors.PyMongoError as exc:
                log.info("backlog %s: ending the promotion failed (%s); it ends by its bound", gate["_id"], exc)


def _promote(gate: CounterDoc, now: datetime, room: int) -> CounterDoc | None:
    """The promotion once claimed (see :func:`promote`)."""
    limit = max(1, int(lease_settings.QUEUE_LIMIT))
    docs = list(store.tickets().find({"g": gate["_id"]}, {"ticket": 1}).sort("at", 1).limit(limit))
    waiting = [d["ticket"] for d in docs if isinstance(d.get("ticket"), dict)]
    if not waiting:
        if count(gate):  # the count drifted (a writer died between its two commands)
            store.counters().update_one({"_id": gate["_id"], "bk": gate.get("bk")}, {"$set": {"bk": 0}})
        return None
    head = list(gate.get("queue") or ())
    queued = {t.get("id") for t in head}
    stale = [t for t in waiting if order.is_stale(t, now)]
    stale_ids = {t.get("id") for t in stale}
    lanes: dict[tuple[Any, ...], list[TicketDoc]] = defaultdict(list)
    for ticket in waiting:  # oldest first: each lane's next ones, as the rule takes them
        if ticket.get("id") not in stale_ids and ticket.get("id") not in queued and len(lanes[_lane(ticket)]) < room:
            lanes[_lane(ticket)].append(ticket)
    candidates = [t for lane in lanes.values() for t in lane]
    ranked = order.ranked({**gate, "queue": head + candidates}, now, limit=len(head) + room)
    chosen = [t for t in ranked if t.get("id") not in queued][:room]
    gone = [str(t["id"]) for t in chosen] + [str(t["id"]) for t in stale]
    taken = store.tickets().delete_many({"_id": {"$in": gone}, "g": gate["_id"]}).deleted_count
    after = store.counters().find_one_and_update(
        {"_id": gate["_id"], "queue.id": {"$nin": [t["id"] for t in chosen]}},
        {"$push": {"queue": {"$each": chosen}}, "$inc": {"bk": -taken}, "$currentDate": {"clock": True},
         "$unset": {PROMOTING: ""}},
        return_document=ReturnDocument.AFTER)
    if after is None:
        # A ticket chosen was queued in the head meanwhile: put them all back, counted.
        store.tickets().insert_many([{"_id": t["id"], "g": gate["_id"], "at": t.get("at"), "ticket": t}
                                     for t in chosen], ordered=False)
        store.counters().update_one({"_id": gate["_id"]}, {"$inc": {"bk": len(chosen) - taken}})
        return None
    if stale:
        ids = [str(t["id"]) for t in stale]
        store.holders().delete_many(commands.pruned_holders(ids))
        store.tombstones().bulk_write(ticket_tombstones({**gate, "queue": stale}, ids, "ticket-expired"),
                                      ordered=False)
        log.info("backlog %s: dropped %d stale tickets", gate["_id"], len(stale))
    return after


def find(gate_key: str, ticket_id: str, *, head: int | None = None,
         doc: dict[str, Any] | None = None) -> tuple[TicketDoc, int] | None:
    """``ticket_id``'s ticket in the backlog of ``gate_key`` and its place: after the whole
    head (``head`` tickets, as the caller read the gate; else read here), in arrival order
    among the backlog (the rule promotes by its own order, so the place is an estimate);
    None when it is not there. ``doc``: its backlog document as the caller just read it
    (:func:`get`). One read with both, three with neither.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    if doc is None:
        doc = get(ticket_id, gate_key)
    if doc is None or not isinstance(doc.get("ticket"), dict):
        return None
    ahead = store.tickets().count_documents({"g": gate_key, "at": {"$lt": doc.get("at")}})
    if head is None:
        head = len((store.counters().find_one({"_id": gate_key}, {"queue.id": 1}) or {}).get("queue") or ())
    return doc["ticket"], head + ahead + 1


def safe_promote(gate: CounterDoc | None, *, force: bool = False) -> CounterDoc | None:
    """:func:`promote`, never raising (a failed promotion is tried again at the next look)."""
    if gate is None:
        return None
    try:
        return promote(gate, force=force)
    except pymongo.errors.PyMongoError as exc:
        log.info("promotion on %s failed (%s); tried again at the next look", gate.get("_id"), exc)
        return None

