"""The counter document's commands: every filter and update the engine sends to
``resource_lease_counters`` to book and return slots, each with the invariant it keeps.

A counter lists its bookings in ``holders`` (one entry per booked slot, see
:mod:`leases.store.entries`) with ``count`` kept equal to its length by the same atomic
update. The builders are pure (no I/O): the sync path (:mod:`leases.queue.slots`) and the
async one (``leases.engine.aio_*``) send exactly what they return. What the layers above
decide comes in as values: the cap-stamp clause (:mod:`leases.definitions.caps`), the fence
proposal (:mod:`leases.queue.fences`), the share charge (:mod:`leases.queue.shares`). The
queue's commands on the gate are in :mod:`leases.store.ticket_commands`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pymongo import UpdateOne

Command = tuple[dict[str, Any], dict[str, Any]]


#: The ``at`` of the cap stamp a counter is born with until it is settled (:func:`settle_cap`):
#: later than any view, so every view of the lease obeys the stamp's cap of 1.
PENDING_AT = datetime(9999, 1, 1)


def seed(*, resource: str, level: str, scope: str, tenant_id: str | None, cap: int,
         lease: str | None = None) -> dict[str, Any]:
    """What a counter created by its first booking is written with (``$setOnInsert``).

    Invariant: *a lowered cap binds a counter created after its write* — with ``lease`` (the
    booking's lease, whose view may predate a write that could not stamp a counter that did
    not exist) the counter is born *pending*: ``cap`` 1 and the lease's stamp ``{cap: 1, at:
    PENDING_AT}``, which binds every view of the lease (``count < 1``: its creator's entry
    alone) until :func:`settle_cap` puts the cap of a fresh read in their place. Every cap
    is at least 1, so the pending counter is never above any.
    """
    if lease is None:
        return {"resource": resource, "level": level, "scope": scope, "tenantId": tenant_id, "cap": cap}
    return {"resource": resource, "level": level, "scope": scope, "tenantId": tenant_id, "cap": 1,
            "capStamps": {lease: {"cap": 1, "at": PENDING_AT}}}


def take_slot(key: str, booking: str, *, cap: int, seeded: dict[str, Any], gate: bool = False,
              privileged: bool = False, ticket: str | None = None, clauses: Sequence[dict[str, Any]] = (),
              charge: dict[str, dict[str, Any]] | None = None, record: dict[str, Any] | None = None) -> Command:
    """One level's booking (an upsert): push ``booking`` and count it.

    Invariants: *never above cap* — the filter requires ``count < cap``; *no slot taken
    twice* — the filter requires the entry not listed yet; *count equals the entries* —
    push and increment in one update, and only on a counter that has ``holders`` (one
    written before entries existed is converted first). On a level without room the upsert's
    insert collides on ``_id``, which stops an ordered bulk there: no wider level is touched
    after a full one. *No barging* — on the ``gate`` a newcomer books only while nobody
    queues; a ``privileged`` booking needs ``ticket`` still queued (``$elemMatch``, so the
    upsert's document is seeded by nothing but ``_id``), dequeues it in the same update and
    applies ``charge`` (the order rule's share accounting). ``clauses``: more conditions
    (the cap stamp, the fence slot being free); ``record``: more ``$set`` fields (the fence
    issued). ``seeded``: :func:`seed`.
    """
    query: dict[str, Any] = {"_id": key, "count": {"$lt": cap}, "holders": {"$ne": booking, "$exists": True}}
    if gate and not privileged:
        query["queue.0"] = {"$exists": False}
        query["bk"] = {"$not": {"$gt": 0}}  # nor in its backlog (leases.queue.backlog)
    elif gate and ticket is not None:
        query["queue"] = {"$elemMatch": {"id": ticket}}
    if clauses:
        query["$and"] = list(clauses)
    update: dict[str, Any] = {
        "$push": {"holders": booking}, "$inc": {"count": 1}, "$currentDate": {"updatedAt": True},
        "$setOnInsert": seeded,
    }
    if gate and privileged and ticket is not None:
        update["$pull"] = {"queue": {"id": ticket}}
        for op, values in (charge or {}).items():
            update[op] = {**update.get(op, {}), **values}
    if record is not None:
        update["$set"] = {**update.get("$set", {}), **record}
    return query, update


def create(key: str, seeded: dict[str, Any]) -> Command:
    """A missing counter, created empty by a pure ``_id`` upsert (a no-op when it exists).

    Invariant: a simultaneous first use never reports Busy — a conditional filter would
    make the loser's insert collide on ``_id``.
    """
    return {"_id": key}, {"$setOnInsert": {"count": 0, "holders": [], **seeded}}


def refresh_cap(key: str, cap: int, stamp_older: dict[str, Any]) -> UpdateOne:
    """Set the counter's ``cap`` to a view's ``cap`` when that view is newer than the
    lease's stamp there (``stamp_older``, the filter part saying so).

    Invariants: never upserts, so it never fails the ordered bulk it ends; ``$ne``: the
    common case (the cap is already this one) writes nothing.
    """
    return UpdateOne({"_id": key, "cap": {"$ne": cap}, **stamp_older}, {"$set": {"cap": cap}})


def stamp_cap(key: str, lease: str, cap: int) -> Command:
    """A definition write's stamp on counter ``key``: its new ``cap``, and the stamp of
    ``lease`` (the cap and the server time) that bookings from older views obey.

    Invariant: a lowered cap binds every booking at once — a view loaded before the stamp
    books only below the stamped cap (the booking's cap-stamp clause).
    """
    return {"_id": key}, {"$set": {"cap": cap, f"capStamps.{lease}.cap": cap},
                          "$currentDate": {f"capStamps.{lease}.at": True}}


def settle_cap(key: str, lease: str, cap: int) -> Command:
    """Settle counter ``key`` born pending (:func:`seed`): :func:`stamp_cap` with ``cap``, read
    fresh after the counter was created, only while the lease's stamp is still the pending one.

    Invariant: *a settle never undoes a write's stamp* — a definition write whose stamp pass
    found the counter stamped it already (with a read as fresh), and the settle matches nothing.
    """
    query, update = stamp_cap(key, lease, cap)
    return {**query, f"capStamps.{lease}.at": PENDING_AT}, update


def pull(key: str, booking: str, more: dict[str, Any] | None = None, *, fence_slot: str | None = None) -> Command:
    """Return ``booking``'s slot on counter ``key``, stamping ``clock`` for the hand-off;
    ``more``: other update operators for the same command (the hold duration).

    Invariant: *no slot returned twice* — the pull is by entry value and only a counter
    that still lists the entry matches, so racing releasers, reapers and repairers
    decrement it at most once. The entry's grant claim (:func:`claim_field`) goes with it.

    ``fence_slot``: the fence slot (``fence.sN``) this booking recorded, when its owner
    gives the booking back to book the same entry again later (a level full further on):
    the slot's entry is cleared in the same update, or the entry — booked again on
    another slot — would keep both occupied. Only while the entry is booked does the pull
    match, and no booking can record a slot whose entry is booked, so the slot still names
    this entry then; its generation stays (fences only grow).
    """
    token = booking.rsplit("/", 1)[-1]
    update: dict[str, Any] = {"$pull": {"holders": booking}, "$inc": {"count": -1},
                              "$unset": {claim_field(token): ""},
                              "$currentDate": {"updatedAt": True, "clock": True}, **(more or {})}
    if fence_slot is not None:
        update["$set"] = {**update.get("$set", {}), f"{fence_slot}.e": ""}
    return {"_id": key, "holders": booking}, update


def claim_field(token: str) -> str:
    """Where a gate keeps when a slot was handed over to ``token``'s ticket and not yet
    claimed (:mod:`leases.queue.grants`); the pull of its entry removes it."""
    return f"claims.{token}"


def pull_ops(keys: Sequence[str], booking: str, *, fence: tuple[str, str] | None = None) -> list[UpdateOne]:
    """:func:`pull` on each counter of ``keys`` (one unordered bulk, the narrow levels);
    ``fence``: (counter key, ``fence.sN``) the booking recorded, cleared with its pull."""
    return [UpdateOne(*pull(key, booking, fence_slot=_slot_on(key, fence))) for key in keys]


def gate_pull(gate: str, booking: str, record: dict[str, Any] | None = None, *,
              fence: tuple[str, str] | None = None) -> Command:
    """:func:`pull` on the gate, with ``record``'s operators merged in; sent as
    ``findAndModify`` returning the gate after, which hands the slot to the next ticket."""
    return pull(gate, booking, record, fence_slot=_slot_on(gate, fence))


def _slot_on(key: str, fence: tuple[str, str] | None) -> str | None:
    return fence[1] if fence is not None and fence[0] == key else None


def convert_legacy(doc: dict[str, Any], entries: list[str]) -> Command:
    """Give a counter written before entries existed its ``holders`` list.

    Invariant: the conversion lands only on the counter as read — no ``holders`` yet, the
    same ``count`` and ``updatedAt`` — so a booking since makes it match nothing.
    """
    guard: dict[str, Any] = {"_id": doc["_id"], "holders": {"$exists": False}, "count": doc.get("count")}
    updated_at = doc.get("updatedAt")
    guard["updatedAt"] = updated_at if updated_at is not None else {"$exists": False}
    return guard, {"$set": {"holders": entries, "count": len(entries)}, "$currentDate": {"updatedAt": True}}


def fence_clause(path: str, generation: int) -> dict[str, Any]:
    """The booking filter's fence part on the slot stored at ``path`` (``$fences.sN``).

    Invariant: *fences only grow* — the slot is free (its last entry is no longer booked)
    and its recorded generation is below ``generation``; the same update records both
    (:func:`fence_record`), so two bookings never issue one fence.
    """
    return {"$expr": {"$and": [
        {"$not": [{"$in": [{"$ifNull": [f"{path}.e", None]}, {"$ifNull": ["$holders", []]}]}]},
        {"$lt": [{"$ifNull": [f"{path}.g", 0]}, generation]},
    ]}}


def fence_record(field: str, entry: str, generation: int) -> dict[str, Any]:
    """The booking update's fence part: the slot's new holder entry and generation."""
    return {field: {"e": entry, "g": generation}}


def recount(doc: dict[str, Any], booked: int) -> Command:
    """Reconcile's correction of a counter whose ``count`` differs from its entries.

    Invariant: *count equals the entries* — set to the list's length, only on the counter
    as read (``count`` and ``updatedAt`` as seen: a booking since makes it match nothing).
    """
    guard = {"_id": doc["_id"], "count": doc.get("count"), "updatedAt": doc.get("updatedAt")}
    return guard, {"$set": {"count": booked}, "$currentDate": {"updatedAt": True}}


def drop_idle(doc: dict[str, Any]) -> dict[str, Any]:
    """The filter deleting an idle counter (nothing booked, nobody queued).

    Invariants: only the counter as read, still empty and without a queue; never one that
    has a ``fence`` (its generations must outlive it, or a fence could be issued twice).
    """
    return {"_id": doc["_id"], "count": doc.get("count"), "updatedAt": doc.get("updatedAt"),
            "holders.0": {"$exists": False}, "queue.0": {"$exists": False}, "fence": {"$exists": False},
            "bk": {"$not": {"$gt": 0}}}
