"""The waiting queue's commands on the gate counter (its ``queue`` of tickets), each with
the invariant it keeps.

A ticket is an element of the gate counter's ``queue`` (:mod:`leases.store.shapes` names
its fields). Every command here that the order rule decides on returns the gate (sent as
``findAndModify``, the document after) and stamps ``clock`` with MongoDB's time, so the
decision runs on what that command saw. Pure builders (no I/O): :mod:`leases.queue.waiting`
sends them; the tickets' holder documents are ended by :mod:`leases.store.holder_commands`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .client import PRESENCE
from .counter_commands import claim_field, pull

Command = tuple[dict[str, Any], dict[str, Any]]
#: The array filter naming one ticket (``queue.$[mine]``), with its id.
Mine = list[dict[str, Any]]


def mine(ticket_id: str) -> Mine:
    """The ``array_filters`` of a command on the ticket ``ticket_id``.

    arrayFilters, not the positional ``$``: the embedded server's findAndModify does not
    resolve ``$`` (MongoDB takes both).
    """
    return [{"mine.id": ticket_id}]


def enqueue(gate_key: str, ticket: dict[str, Any], limit: int | None = None) -> Command:
    """Append ``ticket`` to the gate's queue.

    Invariants: *one ticket per id* — the filter requires the id not queued yet, so a
    repeated enqueue matches nothing (the caller then reads the queued one); *a bounded
    head* — with ``limit``, a queue that holds ``limit`` tickets already matches nothing, and
    so does a gate whose backlog holds tickets (``bk``): they arrived first, and the
    newcomer goes behind them (:mod:`leases.queue.backlog`).
    """
    query: dict[str, Any] = {"_id": gate_key, "queue.id": {"$ne": ticket["id"]},
                             # Nobody waits in the backlog (leases.queue.backlog): they are older.
                             "bk": {"$not": {"$gt": 0}}}
    if limit is not None:
        query[f"queue.{max(0, int(limit) - 1)}"] = {"$exists": False}
    return query, {"$push": {"queue": ticket}, "$currentDate": {"clock": True}}


def requeue(gate_key: str, booking: str, ticket: dict[str, Any], *, fence_slot: str | None = None) -> Command:
    """The gate's part of a grant's undo: pull the ticket's entry ``booking`` (freeing the
    fence slot the grant recorded, ``fence_slot``: :func:`leases.store.counter_commands.pull`)
    and queue ``ticket`` again as it was, in one update.

    Invariant: *a ticket is queued again only with the entry it was granted taken back* —
    the filter requires the entry still booked, so when somebody else has given it back
    first (its waiter, after a claim that found the grant undone; its lease's release, after
    a claim before the undo; repair) the ticket is not queued again: its ``attemptId`` names
    a holder that is gone or written again, and a later grant would book that entry once
    more — on another fence slot than the one it still names, which that one pull did not
    clear: one booking on two slots. Whoever took the entry back decides (a waiter queues
    again with a holder of its own). *One ticket per id* — as :func:`enqueue`.
    """
    query, update = pull(gate_key, booking, fence_slot=fence_slot)
    query["queue.id"] = {"$ne": ticket["id"]}
    update["$push"] = {"queue": ticket}
    return query, update


def keep_alive(gate_key: str, ticket_id: str, *, ttl_ms: int | None = None,
               live_at: datetime | None = None) -> Command:
    """Refresh the ticket's ``seen`` on MongoDB's clock (with :func:`mine`).

    Invariants: *never revives a granted or pruned ticket* — only a ticket still queued
    matches; with ``live_at`` (and ``ttl_ms``) only one still live then, so a late poll
    cannot revive one the order rule already passed over. ``ttl_ms``: a ticket kept for an
    HTTP client lives as long as its poll bound, and no process waits on it any more (its
    waker ``w`` is cleared).
    """
    update: dict[str, Any] = {"$currentDate": {"queue.$[mine].seen": True, "clock": True}}
    if ttl_ms is not None:
        update["$set"] = {"queue.$[mine].ttl": int(ttl_ms), "queue.$[mine].w": None}
    query: dict[str, Any] = {"_id": gate_key, "queue.id": ticket_id}
    if live_at is not None and ttl_ms is not None:
        query = {"_id": gate_key, "queue": {"$elemMatch": {
            "id": ticket_id, "seen": {"$gte": live_at - timedelta(milliseconds=int(ttl_ms))}}}}
    return query, update


def grant(gate_key: str, ticket_id: str, booking: str, *, cap: int, clauses: list[dict[str, Any]],
          charge: dict[str, dict[str, Any]], record: dict[str, Any], claimed_by: str | None = None) -> Command:
    """Hand a free gate slot to the queued ticket ``ticket_id`` (the direct hand-off): book
    its entry ``booking``, dequeue it, charge its pass and record its fence, in one update
    that returns the gate (with :func:`mine` not needed: the ticket leaves the queue).

    Invariants: *never above cap* — ``count < cap`` where ``cap`` is the gate's as read (the
    filter also requires that ``cap``, so a cap written since makes it match nothing); *no
    slot taken twice* — the entry is not listed yet; *one grant per ticket* — the ticket must
    still be queued (``$elemMatch``) and leaves the queue in the same update, so of a
    releaser granting it and its own waiter booking at once exactly one lands. ``clauses``:
    the fence slot being free; ``charge``: the order rule's share accounting; ``record``: the
    fence issued (``$set`` fields); ``claimed_by``: the token whose waiter must claim the
    slot in time — the grant's time is kept under :func:`leases.store.counter_commands.claim_field`
    until the entry is pulled (none for an HTTP ticket: its poll deadline is its window).
    """
    query: dict[str, Any] = {"_id": gate_key, "cap": cap, "count": {"$lt": cap},
                             "holders": {"$ne": booking, "$exists": True},
                             "queue": {"$elemMatch": {"id": ticket_id}}}
    if clauses:
        query["$and"] = list(clauses)
    update: dict[str, Any] = {"$push": {"holders": booking}, "$inc": {"count": 1},
                              "$pull": {"queue": {"id": ticket_id}},
                              "$currentDate": {"updatedAt": True, "clock": True}, "$set": dict(record)}
    if claimed_by is not None:
        update["$currentDate"][claim_field(claimed_by)] = True
    for op, values in charge.items():
        update[op] = {**update.get(op, {}), **values}
    return query, update


def read_with_clock(gate_key: str, *, beats: list[str] | None = None) -> list[dict[str, Any]]:
    """The aggregation that reads the gate with ``clock`` set to MongoDB's time now, without
    writing it (a release reads the gate it is about to hand a slot over on, :func:`swap`).

    ``beats``: process ids whose heartbeats (``seen``, :data:`~.client.PRESENCE`) come back
    in the same command, after the gate (:func:`leases.queue.presence.read_gate`).
    """
    pipeline: list[dict[str, Any]] = [{"$match": {"_id": gate_key}}, {"$addFields": {"clock": "$$NOW"}}]
    if beats:
        pipeline.append({"$unionWith": {"coll": PRESENCE, "pipeline": [
            {"$match": {"_id": {"$in": list(beats)}}}, {"$project": {"seen": 1}}]}})
    return pipeline


def swap(gate_key: str, *, released: str, holders: list[str], booking: str, ticket_id: str, cap: int,
         slot_field: str, slot_seen: dict[str, Any] | None, charge: dict[str, dict[str, Any]],
         record: dict[str, Any], more: dict[str, Any] | None = None, claimed_by: str | None = None) -> Command:
    """A release's return of its gate slot that grants it to the queued ticket ``ticket_id``
    in the same update (the direct hand-off in one command): the releaser's entry
    ``released`` is replaced by the ticket's ``booking``, the ticket dequeued, its pass
    charged and its fence (``record``, on the slot at ``slot_field``) recorded.

    Invariants, all from the gate as the releaser just read it: *no slot returned twice or
    taken twice* — the filter requires the entries exactly as read (``holders``, which lists
    ``released`` and not ``booking``), so any booking, return or grant since makes it match
    nothing and the caller returns its slot the plain way; *never above cap* — the count is
    not changed (one entry out, one in) and the cap must be the one read, which the entries
    fit; *one grant per ticket* — the ticket must still be queued and leaves the queue;
    *fences only grow* — the fence slot's record must be as read (``slot_seen``, or none).
    ``more``: the release's own update operators (the hold duration, the wait estimate's
    outcome); ``claimed_by`` as in :func:`grant`.
    """
    query: dict[str, Any] = {"_id": gate_key, "holders": list(holders), "cap": cap, "count": len(holders),
                             "queue.id": ticket_id}
    if slot_seen is None:
        query[slot_field] = {"$exists": False}
    else:  # field by field: a subdocument's equality would also compare its field order
        query.update({f"{slot_field}.{name}": value for name, value in slot_seen.items()})
    update: dict[str, Any] = {"$set": {"holders": [h for h in holders if h != released] + [booking], **record},
                              "$pull": {"queue": {"id": ticket_id}},
                              "$unset": {claim_field(released.rsplit("/", 1)[-1]): ""},
                              "$currentDate": {"updatedAt": True, "clock": True}}
    if claimed_by is not None:
        update["$currentDate"][claim_field(claimed_by)] = True
    for extra in (charge, more or {}):
        for op, values in extra.items():
            update[op] = {**update.get(op, {}), **values}
    return query, update


def mark_blocked(gate_key: str, ticket_id: str, level: str) -> Command:
    """Record which level blocked the ticket last, and when (``lvl``, ``bat``; with
    :func:`mine`). Diagnosis only: no decision reads it as a right to a slot."""
    return ({"_id": gate_key, "queue.id": ticket_id},
            {"$set": {"queue.$[mine].lvl": level}, "$currentDate": {"queue.$[mine].bat": True}})


def dequeue(gate_key: str, ticket_id: str) -> Command:
    """Remove a ticket (timeout, abandon).

    Invariant: idempotent — a pull by id removes it at most once, and nothing else.
    """
    return {"_id": gate_key}, {"$pull": {"queue": {"id": ticket_id}}}


def prune(gate_key: str, ids: list[str]) -> Command:
    """Drop the tickets ``ids`` from the gate's queue (stale, or their waiters gone).

    Invariant: by id only — a ticket queued meanwhile under another id stays.
    """
    return {"_id": gate_key}, {"$pull": {"queue": {"id": {"$in": ids}}}, "$currentDate": {"clock": True}}


def pruned_holders(ids: list[str]) -> dict[str, Any]:
    """The filter deleting the holder documents of pruned tickets (one ``delete_many``).

    Invariant: only ``PENDING`` ones — a ticket granted meanwhile is a lease and stays.
    """
    return {"_id": {"$in": ids}, "state": "PENDING"}


def repair_claim(counter_key: str, checked: datetime | None) -> Command:
    """Claim a full counter for one repair check.

    Invariant: *one repairer at a time* — the filter requires ``checkedAt`` as read, so of
    processes claiming at once one matches; it stamps the server's time for the next.
    """
    return {"_id": counter_key, "checkedAt": checked}, {"$currentDate": {"checkedAt": True}}


def expired_holder(token: str, now: datetime) -> dict[str, Any]:
    """The filter repair ends a holder past its TTL with (reason ``idle``).

    Invariant: only while still past ``now`` (MongoDB's clock as read): a holder renewed
    meanwhile matches nothing.
    """
    return {"_id": token, "expiresAt": {"$lt": now}}
