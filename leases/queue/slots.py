"""Slots on a counter: *which* holder books each one, taken and returned by entry.

A counter document lists its bookings in ``holders``: one entry
``tenant/project/user/attempt/token`` per booked slot, never longer than the cap, with
``count`` kept equal to its length by the same atomic update. ``attempt`` names one writing
of the holder document (its ``attemptId``, new each time the holder is written again under
the same token, e.g. by a waiter whose document was pruned while it stalled), so an entry
names one attempt and is never booked twice; entries written before attempts existed have
the four parts ``tenant/project/user/token``. The token is always the last part.

Knowing the holder behind every slot makes repair exact: an entry whose holder document is
gone, or whose holder was written again since (another ``attemptId``), can be pulled by
value, at most once, without racing anybody else's booking — no counter has to go quiet
first, and a holder written again books another value. The tenant, project and user in
the entry let the waiting queue tell who holds what at a resource from the one counter it
reads anyway.

The widest capped level of a lease is its *gate*: the counter on which waiting tickets
queue. While tickets wait there, newcomers may not take a gate slot (no barging); a waiter
the order rule picked takes it ``privileged``, dequeuing itself in the same update.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pymongo.errors
from pymongo import ReturnDocument, UpdateOne

from ..definitions import caps
from ..definitions.model import LevelSpec
from ..store import client as store
from ..store.documents import CounterDoc

# entry and new_attempt_id: leases/service.py still calls them as slots.entry and
# slots.new_attempt_id until its split into leases/engine/ points them at store.entries.
from ..store.entries import entry, holder_entry, new_attempt_id, superseded, token_of  # noqa: F401

if TYPE_CHECKING:
    from .fences import Plan

log = logging.getLogger(__name__)

def take(specs: Sequence[LevelSpec], booking: str, resource: str, *, gate_key: str,
         privileged: bool = False, ticket: str | None = None,
         charge: dict[str, dict[str, Any]] | None = None, fence: Plan | None = None) -> int:
    """Book ``specs`` in order (narrow → wide) for ``booking`` in one ordered bulk write.

    Each level is a conditional push (``count < cap``, entry not there yet), so a slot is
    taken at most once per entry and never past the cap. The push is an upsert: on a level
    that has no room the insert collides on ``_id`` and stops the bulk right there, so no
    wider level is touched after a full one; a missing counter is created by it (first
    use). A collision can also mean a simultaneous first use: the caller reads that counter
    and tries again when it has room.

    ``gate_key``: the lease's widest level; a newcomer (not ``privileged``) may only take it
    while nobody queues there. A ``privileged`` take needs ``ticket`` still queued there,
    removes it from the queue and applies ``charge`` (the order rule's share accounting,
    ``$inc``/``$max`` operators).

    ``fence``: the slot and generation proposed on the fence counter (:mod:`leases.queue.fences`);
    that level books only if the slot is free and the generation newer, and records them.

    Returns:
        How many of ``specs`` are booked now, from the first: ``len(specs)`` when all.

    Raises:
        pymongo.errors.PyMongoError: the store failed; what is booked is unknown (the caller
            gives every entry back by value, which is idempotent).
    """
    ops = take_ops(specs, booking, resource, gate_key=gate_key, privileged=privileged, ticket=ticket, charge=charge,
                   fence=fence)
    if not ops:
        return 0
    try:
        store.counters().bulk_write(ops, ordered=True)
    except pymongo.errors.BulkWriteError as exc:
        return booked_before(exc)
    return len(specs)


def take_ops(specs: Sequence[LevelSpec], booking: str, resource: str, *, gate_key: str,
             privileged: bool = False, ticket: str | None = None,
             charge: dict[str, dict[str, Any]] | None = None, fence: Plan | None = None) -> list[UpdateOne]:
    """The ordered bulk of :func:`take` (the async executor sends the same one): one
    conditional push per level, then (never failing) the ``cap`` refresh of each level whose
    view is newer than its cap stamp (:mod:`leases.definitions.caps`), run only when every level booked.
    """
    ops = []
    for spec in specs:
        is_gate = spec.key == gate_key
        # "$exists": a counter written before entries existed must be converted first, or its
        # count would stop matching the entries it lists.
        query: dict[str, Any] = {"_id": spec.key, "count": {"$lt": spec.cap},
                                 "holders": {"$ne": booking, "$exists": True}}
        if is_gate and not privileged:
            query["queue.0"] = {"$exists": False}
        elif is_gate and ticket is not None:
            # The privilege is the ticket's turn: a ticket pruned meanwhile (its waiter
            # stalled past the ticket TTL) has none, whatever the waiter last read.
            # $elemMatch, not "queue.id": an equality would seed the upsert's document, whose
            # insert must only collide on _id (as on a full level).
            query["queue"] = {"$elemMatch": {"id": ticket}}
        clauses = []
        if stamp := caps.obeyed(spec):
            # A view loaded before a definition write lowered this cap fits under it too; and
            # the booking never sets ``cap`` itself (only a view newer than the stamp does).
            clauses.append(stamp)
        if fence is not None and spec.key == fence.key:
            clauses.append(fence.clause())  # the fence is issued by this very update
        if clauses:
            query["$and"] = clauses
        update: dict[str, Any] = {
            "$push": {"holders": booking}, "$inc": {"count": 1}, "$currentDate": {"updatedAt": True},
            "$setOnInsert": {"resource": resource, "level": spec.level, "scope": spec.scope, "tenantId": spec.tenant_id,
                             "cap": spec.cap},
        }
        if is_gate and privileged and ticket is not None:
            update["$pull"] = {"queue": {"id": ticket}}
            for op, values in (charge or {}).items():
                update[op] = {**update.get(op, {}), **values}
        if fence is not None and spec.key == fence.key:
            update["$set"] = {**update.get("$set", {}), **fence.update()}
        ops.append(UpdateOne(query, update, upsert=True))
    ops.extend(op for op in map(caps.refresh_op, specs) if op is not None)
    return ops


def booked_before(exc: pymongo.errors.BulkWriteError) -> int:
    """How many levels an ordered take booked before the one that had no room.

    Raises:
        pymongo.errors.BulkWriteError: ``exc`` itself, when it is anything but that one
            ``_id`` collision.
    """
    errors = exc.details.get("writeErrors") or []
    if len(errors) == 1 and errors[0].get("code") == 11000:
        return int(errors[0]["index"])
    raise exc


def create(spec: LevelSpec, resource: str) -> None:
    """Create a missing counter with a pure ``_id`` upsert (a no-op when it exists).

    A conditional filter in the upsert would be wrong: with a simultaneous first use the
    loser's insert would collide on ``_id`` and it would report Busy.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    try:
        store.counters().update_one(
            {"_id": spec.key},
            {"$setOnInsert": {"count": 0, "holders": [], "resource": resource, "level": spec.level,
                              "scope": spec.scope, "tenantId": spec.tenant_id, "cap": spec.cap}},
            upsert=True,
        )
    except pymongo.errors.DuplicateKeyError:
        pass  # created by another process a moment ago


def give_back(keys: Sequence[str], booking: str, *, record: dict[str, Any] | None = None) -> CounterDoc | None:
    """Return ``booking``'s slot on each counter of ``keys`` (narrow first, the gate last).

    Only a counter that still lists the entry is decremented, so racing releasers, reapers
    and repairers return a slot at most once. The gate's update returns its document so the
    caller can hand the slot to the next waiting ticket. ``record``: more update operators
    for the gate (the hold duration, for wait estimates), in the same command.

    Returns:
        The gate counter after the update, or None when it did not list the entry.

    Raises:
        pymongo.errors.PyMongoError: the store failed (repair returns what is left).
    """
    keys = list(keys)
    if not keys:
        return None
    *narrow, gate = keys
    if narrow:
        store.counters().bulk_write(pull_ops(narrow, booking), ordered=False)
    return store.counters().find_one_and_update(*gate_pull(gate, booking, record), return_document=ReturnDocument.AFTER)


def pull_ops(keys: Sequence[str], booking: str) -> list[UpdateOne]:
    """Return ``booking``'s slot on each counter of ``keys`` that still lists it (one bulk)."""
    return [UpdateOne({"_id": key, "holders": booking}, _pull(booking)) for key in keys]


def gate_pull(gate: str, booking: str, record: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The command (filter, update) of :func:`give_back` on the gate ``gate``: return
    ``booking``'s slot if the gate still lists it, stamping ``clock`` for the hand-off,
    with ``record``'s operators merged in. The sync and the async release send exactly this,
    as ``findAndModify`` returning the document after.
    """
    return {"_id": gate, "holders": booking}, {**_pull(booking), **(record or {})}


def _pull(booking: str) -> dict[str, Any]:
    return {"$pull": {"holders": booking}, "$inc": {"count": -1},
            "$currentDate": {"updatedAt": True, "clock": True}}


def pull_entry(key: str, booking: str) -> CounterDoc | None:
    """Pull one entry from one counter (repair); the counter after, or None if it was gone."""
    return store.counters().find_one_and_update(
        {"_id": key, "holders": booking}, _pull(booking), return_document=ReturnDocument.AFTER)


def orphans(bookings: Iterable[str], now: datetime) -> tuple[list[str], list[str]]:
    """Split a counter's entries into those that book for nobody (:func:`superseded`) and
    the tokens of holders that passed their TTL (on ``now``, MongoDB's clock); one query
    for all of them.

    A holder document is always written before its first entry, so an entry without one
    is left by a delete (release, rollback, reap) whose pull has not come — yet, or ever,
    after a crash — and is safe to pull: whoever pulls it first returns the slot, once. A
    holder written again under the same token gets a new ``attemptId`` and books entries
    of its own, so pulling an older attempt's entry by value never takes a live slot.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    bookings = list(dict.fromkeys(bookings))
    tokens = list(dict.fromkeys(token_of(b) for b in bookings))
    if not tokens:
        return [], []
    found = {d["_id"]: d for d in store.holders().find({"_id": {"$in": tokens}}, {"expiresAt": 1, "attemptId": 1})}
    missing = [b for b in bookings if superseded(b, found.get(token_of(b)))]
    expired = [t for t, d in found.items() if d.get("expiresAt") is not None and d["expiresAt"] < now]
    return missing, expired


def convert_legacy(doc: CounterDoc, booked_by: dict[str, list[str]], *, safety: timedelta,
                   now: datetime) -> bool:
    """Give a counter written before entries existed its ``holders`` list, from the holders
    that register it (``booked_by``: key → entries). Guarded by ``count``/``updatedAt`` and the
    reconcile safety margin, like any counter correction.

    Returns:
        True when the counter was converted (or deleted, when nobody books it).

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    updated_at = doc.get("updatedAt")
    if updated_at is not None and updated_at >= now - safety:
        return False
    guard: dict[str, Any] = {"_id": doc["_id"], "holders": {"$exists": False}, "count": doc.get("count")}
    guard["updatedAt"] = updated_at if updated_at is not None else {"$exists": False}
    entries = booked_by.get(doc["_id"], [])
    result = store.counters().update_one(
        guard, {"$set": {"holders": entries, "count": len(entries)}, "$currentDate": {"updatedAt": True}})
    if result.matched_count and doc.get("count") != len(entries):
        log.info("counter %s converted: count %s -> %d booked entries", doc["_id"], doc.get("count"), len(entries))
    return bool(result.matched_count)


def entries_by_key(keys: list[str]) -> dict[str, list[str]]:
    """Booking entries per counter key, from the holders that register the keys.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    out: dict[str, list[str]] = {}
    for doc in store.holders().find({"levels": {"$in": keys}},
                                    {"levels": 1, "tenantId": 1, "projectId": 1, "userId": 1, "attemptId": 1}):
        for key in doc.get("levels") or ():
            if key in keys:
                out.setdefault(key, []).append(holder_entry(doc))
    return out
