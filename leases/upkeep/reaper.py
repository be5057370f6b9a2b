"""Reaping: removing holders (idle, dead pod, operator revoke) and returning their slots.

Only the one who deletes a holder document returns its slots (by booking entry, so a
repairer racing it returns each at most once); any number of pods may reap at once. Every
sweep is bounded and returns ``(done, has_more)``.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from ..engine import holders
from ..revocation import listener
from ..revocation.handlers import RevokedHolder
from ..store import client as store
from ..store.documents import HolderDoc

log = logging.getLogger(__name__)

REAP_BATCH = 500


def reap(query: dict[str, Any], reason: str) -> tuple[HolderDoc | None, RevokedHolder | None]:
    """Delete one holder matching ``query``, return its slots (by entry) and hand them on
    (:func:`leases.engine.holders.end`).

    Only a holder that was handed out (``HELD``) is tombstoned and returned for dispatch: a
    ``PENDING`` one (an attempt that crashed mid-acquire, or a waiter's) never reached its
    consumer, so no handler has anything to clean up.

    Returns:
        ``(deleted document or None, RevokedHolder for dispatch or None)``.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    doc = holders.end(query, reason)
    if doc is None or doc.get("state") != "HELD":
        return doc, None
    return doc, RevokedHolder.from_doc(doc, reason)


def reap_holder(query: dict[str, Any], reason: str) -> RevokedHolder | None:
    """Delete one holder matching ``query`` and return it for dispatch; ``None`` if it was
    gone (or never handed out).

    The caller's ``query`` carries the reap condition (e.g. ``expiresAt < now``) so a holder
    that touched in the meantime is not taken.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    return reap(query, reason)[1]


def reap_idle(*, resource: str | None = None, now: datetime | None = None, limit: int = REAP_BATCH,
              dispatch: bool = True) -> tuple[int, bool]:
    """Reap holders whose ``expiresAt`` passed on MongoDB's clock.

    ``resource`` limits the sweep to one resource (the lazy reap on acquire). Index-backed:
    the cost grows with the number of expired holders, not with all holders.

    Returns:
        ``(reaped, has_more)``.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    now = now if now is not None else store.server_now()
    query: dict[str, Any] = {"expiresAt": {"$lt": now}}
    if resource is not None:
        query = {"resource": resource, **query}
    candidates = list(store.holders().find(query, {"_id": 1}).limit(limit + 1))
    has_more = len(candidates) > limit
    reaped: list[RevokedHolder] = []
    for doc in candidates[:limit]:
        holder = reap_holder({"_id": doc["_id"], "expiresAt": {"$lt": now}}, "idle")
        if holder is not None:
            reaped.append(holder)
    if reaped:
        log.info("idle reap: %d holders%s", len(reaped), f" of {resource}" if resource else "")
        if dispatch:
            listener.notify(reaped)
    return len(reaped), has_more
