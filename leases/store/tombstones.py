"""The one shape of a tombstone: the record an ended holder or ticket leaves behind, so a
later renewal, release or poll answers ``EXPIRED`` with the reason, not ``STALE_LEASE``.

Only command documents live here, each with the invariant it keeps (no I/O, no engine imports), so both the holder protocol
(:mod:`leases.engine.holders`) and the gate's queue (:mod:`leases.queue.waiting`), which the protocol
calls, can build them without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from pymongo import UpdateOne

from .documents import HolderDoc

__all__ = ["claim", "ticket_tombstones", "tombstone_fields", "tombstone_upsert"]


def tombstone_fields(doc: HolderDoc, reason: str, *, keep: bool = False) -> dict[str, Any]:
    """The one shape of a tombstone, as the ``$set`` of a pipeline update: the ended
    holder's (or ticket's) tenant, project and resource, the reason and the time.

    Every writer of a tombstone goes through here, so a tenant-bound lookup
    (:func:`leases.engine.holders.scoped`) finds each one whoever wrote it. ``keep``: a field an earlier write
    set stays (the dispatcher's claim must not move the reap's ``at``, from which the TTL
    index ages the tombstone, nor its reason); a missing tombstone is written whole.
    """
    values = {
        "tenantId": doc.get("tenantId"),
        # projectId lets project-bound API keys see only their project's tombstones.
        "projectId": doc.get("projectId"),
        "reason": reason,
        "resource": doc.get("resource"),
    }
    fields: dict[str, Any] = {name: {"$literal": value} for name, value in values.items()}
    fields["at"] = "$$NOW"
    if keep:
        fields = {name: {"$ifNull": [f"${name}", value]} for name, value in fields.items()}
    return fields


def tombstone_upsert(doc: HolderDoc, reason: str, *, keep: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The tombstone command (filter, pipeline; an upsert) of the ended holder ``doc``;
    ``keep``: an existing tombstone keeps its reason and time (:func:`tombstone_fields`)."""
    return {"_id": doc["_id"]}, [{"$set": tombstone_fields(doc, reason, keep=keep)}]


def claim(ended: HolderDoc, reason: str, pod: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The dispatcher's claim (filter, pipeline; an upsert) on the tombstone of ``ended``.

    Invariant: *one handler run per ending* — only a tombstone nobody claimed yet matches
    (an upsert racing a claimed one collides on ``_id``); ``keep``: the reap's time ``at``
    (the TTL index ages the tombstone from it) and reason stay.
    """
    return ({"_id": ended["_id"], "handledBy": {"$exists": False}},
            [{"$set": {**tombstone_fields(ended, reason, keep=True), "handledBy": {"$literal": pod},
                       "handledAt": "$$NOW"}}])


def ticket_tombstones(gate: Mapping[str, Any], ids: list[str], reason: str) -> list[UpdateOne]:
    """The tombstones (one unordered bulk of upserts) of the tickets ``ids`` pruned from
    ``gate``: who waited from the ticket as queued (``t``, ``p``), where from the gate.

    Invariant: a client polling a pruned ticket late is told EXPIRED, not "unknown"; a
    stand-in for an id not in the queue as read records no tenant or project.
    """
    by_id = {t["id"]: t for t in gate.get("queue") or ()}
    return [UpdateOne(*tombstone_upsert(cast(HolderDoc, {
        "_id": tid, "tenantId": by_id.get(tid, {}).get("t"), "projectId": by_id.get(tid, {}).get("p"),
        "resource": gate.get("resource", "")}), reason), upsert=True) for tid in ids]
