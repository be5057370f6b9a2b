"""The one shape of a tombstone: the record an ended holder or ticket leaves behind, so a
later renewal, release or poll answers ``EXPIRED`` with the reason, not ``STALE_LEASE``.

Only command documents live here (no I/O, no engine imports), so both the holder protocol
(:mod:`leases.engine.holders`) and the gate's queue (:mod:`leases.queue.waiting`), which the protocol
calls, can build them without importing each other.
"""

from __future__ import annotations

from typing import Any

from .documents import HolderDoc

__all__ = ["tombstone_fields", "tombstone_upsert"]


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


def tombstone_upsert(doc: HolderDoc, reason: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The tombstone command (filter, pipeline; an upsert) of the ended holder ``doc``."""
    return {"_id": doc["_id"]}, [{"$set": tombstone_fields(doc, reason)}]
