"""The audit trail (``lease_audit``): who did what to which lease or key, on MongoDB's clock.

Every operator action writes here through :func:`record` — revocations
(:mod:`leases.ops.actions`) and API-key management (:mod:`leases.api.keys`) alike — and names its
actor through :func:`actor_name`, so both kinds of entry read the same way.
"""

from __future__ import annotations

from typing import Any

from bson import ObjectId

from ..errors import AuditEntryNotFound, InvalidLeaseRequest
from ..ids import validation
from ..store import client as store

# Django's username length: an actor is a user's name (or a CLI's "cli:user@host").
ACTOR_MAX = 150
# Kinds of lease revocations; the same collection also records API-key management
# (``apikey-create``, ``apikey-revoke``), which a list of revocations must not show.
REVOCATION_ACTIONS = ("revoke", "revoke-pod")


def actor_name(acting_user: Any) -> str:
    """A printable name for the audit record: a Django user's username or a plain string.

    Raises:
        InvalidLeaseRequest: no ``acting_user``, or a name that is blank, longer than
            ``ACTOR_MAX`` or contains NUL.
    """
    if acting_user is None:
        raise InvalidLeaseRequest("acting_user is required: say who acts")
    name = acting_user.get_username() if hasattr(acting_user, "get_username") else acting_user
    if not isinstance(name, str) or not name.strip() or len(name) > ACTOR_MAX or "\x00" in name:
        raise InvalidLeaseRequest(f"acting_user must name who acts (at most {ACTOR_MAX} characters, no NUL)")
    return name


def record(action: str, *, actor: str, **fields: Any) -> None:
    """Append one audit entry ``{action, actor, **fields, at}``.

    ``at`` is set from ``$$NOW`` so "when" is MongoDB's clock like every other lease
    timestamp; ``$literal`` keeps user-chosen strings from being read as field paths.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    entry = {"action": action, **fields, "actor": actor}
    store.audit().update_one(
        {"_id": ObjectId()},
        [{"$set": {**{k: {"$literal": v} for k, v in entry.items()}, "at": "$$NOW"}}],
        upsert=True,
    )


def list_entries(tenant_id: str | None = None, limit: int = 20,
                 actions: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The latest entries, newest first (of one tenant and of ``actions`` when given).

    The kinds are filtered in the query, so other kinds never push the wanted ones past
    ``limit``. Each entry carries its ``id`` (hex) for :func:`get_entry`.

    Raises:
        InvalidLeaseRequest: malformed tenant id, limit or actions.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    query: dict[str, Any] = {}
    if tenant_id is not None:
        query["tenantId"] = validation.entity_id(tenant_id, "tenant id")
    if actions is not None:
        if isinstance(actions, str) or not all(isinstance(a, str) for a in actions):
            raise InvalidLeaseRequest("actions must be a tuple of audit kinds")
        query["action"] = {"$in": list(actions)}
    limit = validation.positive_int(limit, "limit", 1000)
    return [_entry(doc) for doc in store.audit().find(query).sort([("at", -1)]).limit(limit)]


def get_entry(entry_id: str, tenant_id: str | None = None) -> dict[str, Any]:
    """One entry by its id, bound to ``tenant_id`` when given.

    Raises:
        InvalidLeaseRequest: the id is not a 24-digit hex ObjectId, or the tenant id is malformed.
        AuditEntryNotFound: no such entry (in that tenant); the same answer for another tenant's.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    if not isinstance(entry_id, str) or not ObjectId.is_valid(entry_id) or len(entry_id) != 24:
        raise InvalidLeaseRequest("invalid audit entry id: must be 24 hex digits")
    query: dict[str, Any] = {"_id": ObjectId(entry_id)}
    if tenant_id is not None:
        query["tenantId"] = validation.entity_id(tenant_id, "tenant id")
    doc = store.audit().find_one(query)
    if doc is None:
        raise AuditEntryNotFound(f"no audit entry {entry_id}")
    return _entry(doc)


def _entry(doc: dict[str, Any]) -> dict[str, Any]:
    entry = {k: v for k, v in doc.items() if k != "_id"}
    entry["id"] = str(doc["_id"])
    return entry
