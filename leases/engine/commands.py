"""The holder commands' documents, built once for the sync and the async executor.

Each function is pure: it builds the filter and update the engine sends, so
``leases.service`` (pymongo) and ``leases.aio`` (pymongo's async client) send the very same
commands. Every user string goes in as ``$literal``, so none can be read as a field path
or an operator in a pipeline update.
"""

from __future__ import annotations

from typing import Any

from ..store import client as store
from .intervals import choose_interval

# What a release needs of the holder it deletes: its counters and its booking entry.
# heldAt gives the hold's duration, which the gate keeps for wait estimates.
RELEASE_PROJECTION = {"keys": 1, "levels": 1, "resource": 1, "tenantId": 1, "projectId": 1, "userId": 1, "state": 1,
                      "heldAt": 1, "attemptId": 1}


def holder_upsert(token: str, *, definition: Any, request: Any, pod: str, keys: list[str], attempt_id: str,
                  priority: str | None = None) -> tuple[dict, list]:
    """The PENDING holder document, written on server time (an idempotent upsert).

    ``attempt_id``: names this writing of the document; the entries booked after it carry
    it (:func:`leases.store.entries.entry`), so a holder written again under the same token (with a
    new one) never books a value an earlier attempt left behind for repair to pull.
    """
    return {"_id": token}, [{"$set": {
        "state": "PENDING",
        "attemptId": {"$literal": attempt_id},
        "resource": {"$literal": definition.resource},
        "leaseName": {"$literal": definition.name},
        "type": {"$literal": request.type},
        "tenantId": {"$literal": request.tenant_id},
        "projectId": {"$literal": request.project_id},
        "userId": {"$literal": request.user_id},
        "holderRef": {"$literal": request.holder_ref},
        "priority": {"$literal": priority},
        "pod": {"$literal": pod},
        "podBound": {"$literal": request.pod_bound},
        "ttlSeconds": {"$literal": definition.ttl_seconds},
        # The interval a grant issues (HTTP), chosen once: a ticket granted later keeps it.
        "intervalSeconds": {"$literal": choose_interval(definition.ttl_seconds, request.interval_seconds)},
        "keys": {"$literal": keys},
        "levels": {"$literal": []},
        "payload": {"$literal": {}},
        "acquiredAt": "$$NOW",
        "lastSeenAt": "$$NOW",
        "expiresAt": store.now_plus_ms(definition.ttl_seconds * 1000),
    }}]


def mark_held(token: str, *, keys: list[str], ttl_seconds: int, attempt_id: str | None,
              fence: str | None = None) -> tuple[dict, list]:
    """Every level is booked: the holder becomes HELD with the counters it booked — only
    the holder as written by ``attempt_id`` (the one its entries name; ``None``: a holder
    written before attempts existed), else nothing matches (it vanished, or was written
    again: its entries book for nobody). ``fence``: the one its booking issued, kept on the
    holder so that every renewal, poll and operator view answers it."""
    return {"_id": token, "attemptId": attempt_id}, [{"$set": {
        "state": "HELD", "levels": {"$literal": keys}, "lastSeenAt": "$$NOW", "heldAt": "$$NOW",
        "expiresAt": store.now_plus_ms(ttl_seconds * 1000), "fence": {"$literal": fence}}}]


#: What the HELD update answers (the grant's fields, the fence among them).
HELD_PROJECTION = {"expiresAt": 1, "acquiredAt": 1, "lastSeenAt": 1, "intervalSeconds": 1, "fence": 1}



def adopt(token: str, *, pod: str) -> tuple[dict, dict]:
    """A held lease moves to the pod that uses it now (a kept ticket granted to a retry that
    runs in another process than the one that queued it)."""
    return {"_id": token, "state": "HELD"}, {"$set": {"pod": pod}}
