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
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pymongo.errors
from pymongo import ReturnDocument, UpdateOne

from ..definitions import caps
from ..definitions.model import LevelSpec
from ..store import client as store, counter_commands
from ..store.counter_commands import gate_pull, pull, pull_ops
from ..store.documents import CounterDoc

# entry and new_attempt_id: leases/service.py still calls them as slots.entry and
# slots.new_attempt_id until its split into leases/engine/ points them at store.entries.
from ..store.entries import entry, holder_entry, new_attempt_id, superseded, token_of  # noqa: F401

if TYPE_CHECKING:
    from .fences import Plan

log = logging.getLogger(__name__)

# The builders (leases.store.counter_commands) the async path reaches through this module.
__all__ = ["gate_pull", "pull_ops"]

def take(specs: Sequence[LevelSpec], booking: str, resource: str, *, gate_key: str,
         privileged: bool = False, ticket: str | None = None,
         charge: dict[str, dict[str, Any]] | None = None, fence: Plan | None = None) -> int:
    """Book ``specs`` in order (narrow → wide) for ``booking`` in one ordered bulk write.

    Each level is a conditional push (``count < cap``, entry not there yet), so a slot is
    taken at most once per entry and never past the cap. The push is an upsert: on a level
    that has no room the insert collides on ``_id`` and stops the bulk right there, so no
    wider level is touched after a full one; a missing counter is created by it (first
    use), born pending and settled here from a fresh read (:mod:`leases.definitions.caps`).
    A collision can also mean a simultaneous first use: the caller reads that counter (and
    settles it if still pending) and tries again when it has room.

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
        done = store.counters().bulk_write(ops, ordered=True)
    except pymongo.errors.BulkWriteError as exc:
        settle_created(specs, resource, exc.details.get("upserted"))
        return booked_before(exc)
    settle_created(specs, resource, done.upserted_ids)
    return len(specs)


def settle_created(specs: Sequence[LevelSpec], resource: str, upserted: Any, *, offset: int = 0) -> None:
    """Settle each counter of ``specs`` that an ordered bulk created (``upserted``: the
    result's ``upserted_ids``, or its error's ``upserted`` list; ``offset``: the index in the
    bulk of ``specs[0]``'s op): born pending, it gets the cap of a fresh read
    (:func:`leases.definitions.caps.settle`). Never raises."""
    if isinstance(upserted, dict):
        indexes = list(upserted)
    else:
        indexes = [u.get("index") for u in upserted or () if isinstance(u, dict)]
    created = [specs[i - offset] for i in indexes if isinstance(i, int) and 0 <= i - offset < len(specs)]
    if created:
        caps.settle(created, resource)


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
        fenced = fence is not None and spec.key == fence.key
        # The cap stamp: a view loaded before a definition write lowered this cap fits under
        # it too. The fence is issued by this very update.
        clauses = [c for c in (caps.obeyed(spec), fence.clause() if fence is not None and fenced else None) if c]
        ops.append(UpdateOne(*counter_commands.take_slot(
            spec.key, booking, cap=spec.cap, seeded=_seed(spec, resource), gate=is_gate, privileged=privileged,
            ticket=ticket, clauses=clauses, charge=charge,
            record=fence.update() if fence is not None and fenced else None), upsert=True))
    ops.extend(op for op in map(caps.refresh_op, specs) if op is not None)
    return ops


def _seed(spec: LevelSpec, resource: str) -> dict[str, Any]:
    # Born pending: the booking's view may be older than a write that could not stamp it.
    return counter_commands.seed(resource=resource, level=spec.level, scope=spec.scope, tenant_id=spec.tenant_id,
                                 cap=spec.cap, lease=caps.born(spec, resource))


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
        done = store.counters().update_one(*counter_commands.create(spec.key, _seed(spec, resource)), upsert=True)
    except pymongo.errors.DuplicateKeyError:
        return  # created by another process a moment ago
    if done.upserted_id is not None:
        caps.settle([spec], resource)


def give_back(keys: Sequence[str], booking: str, *, record: dict[str, Any] | None = None,
              fence: tuple[str, str] | None = None) -> CounterDoc | None:
    """Return ``booking``'s slot on each counter of ``keys`` (narrow first, the gate last).

    Only a counter that still lists the entry is decremented, so racing releasers, reapers
    and repairers return a slot at most once. The gate's update returns its document so the
    caller can hand the slot to the next waiting ticket. ``record``: more update operators
    for the gate (the hold duration, for wait estimates), in the same command. ``fence``:
    (counter key, ``fence.sN``) the booking recorded and will book again: cleared by that
    counter's pull (:func:`leases.store.counter_commands.pull`).

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
        store.counters().bulk_write(pull_ops(narrow, booking, fence=fence), ordered=False)
    return store.counters().find_one_and_update(*gate_pull(gate, booking, record, fence=fence),
                                                return_document=ReturnDocument.AFTER)


def pull_entry(key: str, booking: str) -> CounterDoc | None:
    """Pull one entry from one counter (repair); the counter after, or None if it was gone."""
    return store.counters().find_one_and_update(*pull(key, booking), return_document=ReturnDocument.AFTER)


def orphans(bookings: Iterable[str], now: datetime, unclaimed: Iterable[str] = (),
            claiming: Callable[[str, dict[str, Any]], bool] | None = None) -> tuple[list[str], list[str], list[str]]:
    """Split a counter's entries into those that book for nobody (:func:`superseded`), the
    tokens of holders that passed their TTL (on ``now``, MongoDB's clock), and those of
    ``unclaimed`` (granted long enough ago, :func:`leases.queue.grants.unclaimed`) whose
    holder is still ``PENDING`` and not a kept ticket, unless ``claiming`` (token, holder
    document) says its waiter may still claim it; one query for all of them.

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
        return [], [], []
    found = {d["_id"]: d for d in store.holders().find({"_id": {"$in": tokens}},
                                                       {"expiresAt": 1, "attemptId": 1, "state": 1, "polledAt": 1, "w": 1})}
    missing = [b for b in bookings if superseded(b, found.get(token_of(b)))]
    expired = [t for t, d in found.items() if d.get("expiresAt") is not None and d["expiresAt"] < now]
    # A kept ticket (polledAt: a client polls it) has its poll deadline as its window, not
    # the claim window a grant computed while it still had a waiter may have recorded: it
    # ends when that deadline passes (expired), not as unclaimed.
    late = [t for t in unclaimed if t in found and t not in expired and found[t].get("state") == "PENDING"
            and found[t].get("polledAt") is None and not (claiming is not None and claiming(t, found[t]))]
    return missing, expired, late


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
    entries = booked_by.get(doc["_id"], [])
    result = store.counters().update_one(*counter_commands.convert_legacy(dict(doc), entries))
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
