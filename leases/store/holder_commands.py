"""The holder document's commands: every filter and update the engine sends to
``resource_lease_holders``, each with the invariant it keeps.

The builders are pure (no I/O): the sync path (:mod:`leases.engine.funnel`,
:mod:`leases.engine.holders`) and the async one (``leases.engine.aio_*``) send exactly what
they return, so both keep the same invariants. Every user string goes in as ``$literal``, so
none can be read as a field path or an operator in a pipeline update; every id a caller
names goes through :func:`scoped`, so it is a plain string bound to the caller's tenant.
Policies live above the store and come in as values (the interval a grant issues, as a
number or as a pipeline expression: :mod:`leases.engine.intervals`).

The lifecycle, one command per step:

* :func:`holder_upsert` writes the ``PENDING`` holder, before any slot is booked;
* :func:`mark_held` turns it ``HELD`` once every level is booked;
* :func:`renewal` (and :func:`keep_later`) moves the deadline of a ``HELD`` holder;
* :func:`adopt` moves a held lease to the pod that uses it;
* :func:`deletion`, :func:`pending_deletion` end it (the slots go back by entry, see
  :mod:`leases.store.counter_commands`; the tombstone, :mod:`leases.store.tombstones`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypedDict

from ..errors import InvalidLeaseRequest
from .client import now_plus_ms

#: What a release needs of the holder it deletes: its counters and its booking entry.
#: heldAt gives the hold's duration, which the gate keeps for wait estimates.
RELEASE_PROJECTION = {"keys": 1, "levels": 1, "resource": 1, "tenantId": 1, "projectId": 1, "userId": 1, "state": 1,
                      "heldAt": 1, "attemptId": 1}
#: What the HELD update answers (the grant's fields, the fence among them).
HELD_PROJECTION = {"expiresAt": 1, "acquiredAt": 1, "lastSeenAt": 1, "intervalSeconds": 1, "fence": 1}
#: What a renewal returns and a grant answers from.
GRANT_FIELDS = {"resource": 1, "leaseName": 1, "type": 1, "ttlSeconds": 1, "expiresAt": 1, "lastSeenAt": 1,
                "intervalSeconds": 1, "priorExpiresAt": 1, "fence": 1}
#: The fields a caller's scope may bind.
SCOPE_FIELDS = ("tenantId", "projectId")

Command = tuple[dict[str, Any], list[dict[str, Any]]]


class Scope(TypedDict, total=False):
    """The tenant binding of a caller, as it appears in holder and tombstone filters."""

    tenantId: str
    projectId: str


def scope(tenant_id: str, project_id: str | None = None) -> Scope:
    """The filter part binding a query to ``tenant_id`` (and ``project_id``, when given).

    Invariant: an id is a non-empty plain string, never an operator document.

    Raises:
        InvalidLeaseRequest: an id that is not a plain string (never an operator).
    """
    bound: Scope = {"tenantId": _plain(tenant_id, "tenant id")}
    if project_id:
        bound["projectId"] = _plain(project_id, "project id")
    return bound


def _plain(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidLeaseRequest(f"{what} must be a non-empty string")
    return value


def scoped(token: str, bound: Scope | None) -> dict[str, Any]:
    """The tenant-bound filter of one holder or tombstone: ``{_id, tenantId[, projectId]}``.

    Invariant: tenant isolation — another tenant's token matches nothing, so it answers
    like one that never existed; only the scope fields may bind, each a plain string.

    Raises:
        InvalidLeaseRequest: ``bound`` has other keys or non-string values.
    """
    query: dict[str, Any] = {"_id": token}
    for name, value in (bound or {}).items():
        if name not in SCOPE_FIELDS:
            raise InvalidLeaseRequest(f"a scope binds only {', '.join(SCOPE_FIELDS)}, not {name!r}")
        query[name] = _plain(value, name)
    return query


def holder_upsert(token: str, *, definition: Any, request: Any, pod: str, keys: list[str], attempt_id: str,
                  interval_seconds: int, priority: str | None = None, wait_ms: int = 0,
                  waker: str | None = None) -> Command:
    """The PENDING holder document, written on server time (an idempotent upsert).

    Invariant: the holder exists before any of its entries (a counter entry without a
    holder is left by a delete, so repair may pull it). ``attempt_id`` names this writing of
    the document; the entries booked after it carry it (:func:`leases.store.entries.entry`),
    so a holder written again under the same token (with a new one) never books a value an
    earlier attempt left behind for repair to pull. ``interval_seconds``: the interval a
    grant issues, chosen once (a ticket granted later keeps it). ``wait_ms``: a holder written
    for a ticket about to queue (never one about to book: an attempt killed mid-funnel must
    give its slots back within its TTL) lives through the rest of its wait too
    (``now + wait + TTL``; see :func:`cover_wait`). ``waker``: the process that waits on it
    (its wake-up id, whose heartbeat says whether it lives: repair gives a grant it has not
    claimed yet more time while it does). Every user value is a ``$literal``.
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
        "w": {"$literal": waker},
        "podBound": {"$literal": request.pod_bound},
        "ttlSeconds": {"$literal": definition.ttl_seconds},
        "intervalSeconds": {"$literal": interval_seconds},
        "keys": {"$literal": keys},
        "levels": {"$literal": []},
        "payload": {"$literal": {}},
        "acquiredAt": "$$NOW",
        "lastSeenAt": "$$NOW",
        "expiresAt": now_plus_ms(definition.ttl_seconds * 1000 + max(0, int(wait_ms))),
    }}]


def mark_held(token: str, *, keys: list[str], ttl_seconds: int, attempt_id: str | None,
              fence: str | None = None, granted_at: datetime | None = None) -> Command:
    """Every level is booked: the holder becomes HELD with the counters it booked.

    Invariant: only the holder as written by ``attempt_id`` (the one its entries name;
    ``None``: a holder written before attempts existed) turns HELD, else nothing matches (it
    vanished, or was written again: its entries book for nobody). ``fence``: the one its
    booking issued, kept on the holder so that every renewal, poll and operator view
    answers it. ``granted_at``: a slot handed over by a release (the direct hand-off), the
    grant's time on MongoDB's clock as the granter's command saw it: the TTL runs from
    there, so the claimant knows its deadline without asking for the document back.
    """
    seen: Any
    deadline: Any
    if granted_at is None:
        seen, deadline = "$$NOW", now_plus_ms(ttl_seconds * 1000)
    else:
        seen, deadline = {"$literal": granted_at}, {"$literal": granted_at + timedelta(seconds=ttl_seconds)}
    query: dict[str, Any] = {"_id": token, "attemptId": attempt_id}
    if fence is not None:
        query[UNDONE_GRANTS] = {"$ne": fence}  # a grant being undone is never claimed (grant_undone)
    return query, [{"$set": {
        "state": "HELD", "levels": {"$literal": keys}, "lastSeenAt": seen, "heldAt": "$$NOW",
        "expiresAt": deadline, "fence": {"$literal": fence}}}]


#: The fences of grants to a holder that their granter undid not knowing whether they had
#: landed (:func:`grant_undone`): :func:`mark_held` never claims one of them.
UNDONE_GRANTS = "undoneGrants"


def grant_undone(token: str, attempt_id: str | None, fence: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A granter's undo of the grant ``fence`` to the ticket ``token`` whose bulk may have
    landed (its answer was lost): only while the holder (as written by ``attempt_id``) is
    still ``PENDING``, record that this grant is undone, before its entries are pulled.

    Invariant: a claimed lease is never stripped of its slots — the holder's one document
    orders the two: the waiter's mark of that grant (which requires the fence not undone)
    lands first, and this matches nothing (the grant stands); or this lands first, and the
    mark matches nothing (the waiter gives the entry back and queues again). Fences never
    repeat, so a later grant to the same holder is claimed as usual.
    """
    return ({"_id": token, "attemptId": attempt_id, "state": "PENDING"},
            {"$addToSet": {UNDONE_GRANTS: fence}})


def cover_wait(token: str, attempt_id: str | None, ms: int) -> Command:
    """A waiter's one move of its waiting holder's deadline (``PENDING``) to ``now + ms``:
    the rest of its wait plus the TTL, so it lives through the wait without a keep-alive —
    a queue costs the store no write per waiter and period — and a grant at the end of the
    wait still finds it with its TTL to spare. A process that dies meanwhile loses its
    holders with its pod (the dead-pod sweep) and its tickets with its heartbeat; a holder
    without a grant books nothing.

    Invariant: only the holder as written by ``attempt_id`` (the one its ticket's grant would
    name) matches — a waiter that finds none was reaped (it stalled past its TTL) and must
    queue again with a new holder. Only a ``PENDING`` holder's deadline moves (never back); a
    granted (``HELD``) one is left as its claim set it. Dates compare as epoch milliseconds,
    as in :func:`renewal`.
    """
    later = {"$and": [{"$eq": ["$state", "PENDING"]}, {"$gt": [
        {"$toLong": now_plus_ms(ms)}, {"$toLong": {"$ifNull": ["$expiresAt", "$$NOW"]}}]}]}
    return {"_id": token, "attemptId": attempt_id}, [{"$set": {"expiresAt": {"$cond": [
        later, now_plus_ms(ms), "$expiresAt"]}}}]


def unclaimed(token: str) -> dict[str, Any]:
    """The filter repair ends a granted ticket with whose waiter did not claim its slot in
    time (reason ``idle``; a ``PENDING`` holder runs no handler).

    Invariant: only while still ``PENDING`` — a waiter that claimed meanwhile is ``HELD``
    and matches nothing; one that claims after this delete finds no holder and gives the
    entry back (it was pulled here already: by value, at most once).
    """
    return {"_id": token, "state": "PENDING"}


def adopt(token: str, *, pod: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A held lease moves to the pod that uses it now (a kept ticket granted to a retry that
    runs in another process than the one that queued it).

    Invariant: only a ``HELD`` holder moves; a ticket still waiting keeps its pod.
    """
    return {"_id": token, "state": "HELD"}, {"$set": {"pod": pod}}


def renewal(query: dict[str, Any], *, payload: dict[str, Any] | None = None,
            interval: dict[str, Any] | None = None) -> Command:
    """The renewal command (filter, pipeline) of the holder ``query`` (:func:`scoped`): the
    sync and the async path send exactly this, as ``findAndModify`` returning the document
    after (:data:`GRANT_FIELDS`).

    Invariants: the deadline never moves backwards and an expired holder is never revived.
    It stamps ``lastSeenAt`` (now) and keeps the deadline in ``priorExpiresAt``. A live
    holder gets ``now + ttl`` (and the payload, a ``$literal``, and ``interval``, a pipeline
    expression on its own ``ttlSeconds``); one already past its deadline keeps everything as
    it was. The caller then decides on the two server times the command returned (and sends
    :func:`keep_later` when the replaced deadline was later).
    """
    ttl_ms = {"$multiply": [{"$ifNull": ["$ttlSeconds", 0]}, 1000]}
    # Decided inside the command, never by the caller afterwards: if ending an expired
    # holder fails, a deadline written first would revive it for the next renewal. Dates
    # are compared as epoch milliseconds (the embedded server compares a stored date with
    # $$NOW wrongly); a holder without a deadline counts as live, as in the verdict.
    live = {"$gte": [{"$toLong": {"$ifNull": ["$expiresAt", "$$NOW"]}}, {"$toLong": "$$NOW"}]}

    def if_live(value: Any, field: str) -> dict[str, Any]:
        return {"$cond": [live, value, f"${field}"]}

    update: dict[str, Any] = {
        "priorExpiresAt": "$expiresAt",
        "lastSeenAt": "$$NOW",
        "expiresAt": if_live({"$add": ["$$NOW", ttl_ms]}, "expiresAt"),
    }
    if payload is not None:
        # $literal: a payload string such as "$x" must stay a string in a pipeline update.
        update["payload"] = if_live({"$literal": payload}, "payload")
    if interval is not None:
        update["intervalSeconds"] = if_live(interval, "intervalSeconds")
    return {**query, "state": "HELD"}, [{"$set": update}]


def keep_later(token: str, prior: datetime) -> Command:
    """The second command of a renewal whose replaced deadline ``prior`` was later.

    Invariant: the deadline is ``max(stored, prior)``, never earlier than either.
    """
    return {"_id": token, "state": "HELD"}, [{"$set": {"expiresAt": {"$max": ["$expiresAt", prior]}}}]


def held(token: str) -> dict[str, Any]:
    """The filter of the ``HELD`` holder ``token`` (an expired one reaped on its renewal)."""
    return {"_id": token, "state": "HELD"}


def deletion(query: dict[str, Any], reason: str) -> tuple[dict[str, Any], dict[str, int] | None]:
    """The command that ends a holder: ``findAndModify`` removing the one matching
    ``query`` (filter, projection). The sync and the async path send exactly this.

    Invariant: one deleter per holder — only the one whose delete returned the document
    gives its slots back. A release projects what its give-back needs
    (:data:`RELEASE_PROJECTION`); a reap keeps the whole document, which the handler and
    the history get.
    """
    return query, RELEASE_PROJECTION if reason == "release" else None


def pending_deletion(query: dict[str, Any]) -> dict[str, Any]:
    """The filter that ends a ticket never granted: ``query`` (its tenant binding
    included), only while ``PENDING``.

    Invariant: a granted (``HELD``) holder is never dropped as a ticket; a waiting holder
    books no slot, so nothing goes back to a counter.
    """
    return {**query, "state": "PENDING"}


def ended_lookup(token: str, bound: Scope | None) -> tuple[dict[str, Any], dict[str, int]]:
    """The tombstone read (filter, projection) that tells why ``token`` is no lease any
    more, in the caller's scope (:func:`scoped`)."""
    return scoped(token, bound), {"reason": 1}


def discard(token: str) -> dict[str, Any]:
    """The filter dropping the holder of an attempt that books nothing (it gave back what
    it took when it found a level full)."""
    return {"_id": token}


def rollback(token: str) -> dict[str, Any]:
    """The rollback's delete (filter) of an attempt's holder: a plain delete, as nothing of
    the document is needed (a ``findAndModify`` on an existing document costs the embedded
    server a scan of the collection, which holds every waiter's holder: 20 ms at 1,000,
    and rollbacks come in bursts when the store is slow).

    Invariant: whoever deletes the holder returns its entries (by value, so also when it
    was already reaped: nobody can pull an entry twice).
    """
    return {"_id": token}


def poll_ticket(query: dict[str, Any], keep_ms: int) -> Command:
    """A kept ticket's poll on its waiting holder ``query`` (:func:`scoped`); also sent when
    the ticket is kept (the acquire's 202), so its holder lives to the poll deadline.

    Invariants: the poll deadline is the ticket's window, granted or not — a holder polled
    in time gets the deadline ``now + keep_ms`` (so the idle reap never takes a ticket being
    polled, and a ticket a release granted between polls gives its slot back at that
    deadline if nobody polls it, not after the lease's TTL); a poll after the deadline does
    not revive it: its deadline stays as it was (before ``polledAt``, which the caller
    compares it with: the ticket is over). Only a ``PENDING`` holder matches (a granted one
    is answered as the lease). Dates compare as epoch milliseconds, as in :func:`renewal`.
    """
    live = {"$gte": [{"$toLong": {"$ifNull": ["$expiresAt", "$$NOW"]}}, {"$toLong": "$$NOW"}]}
    return {**query, "state": "PENDING"}, [{"$set": {"polledAt": "$$NOW", "expiresAt": {
        "$cond": [live, {"$add": ["$$NOW", int(keep_ms)]}, "$expiresAt"]}}}]


def poll_missed(holder: dict[str, Any]) -> bool:
    """Whether the holder a :func:`poll_ticket` answered was past its deadline at that poll
    (both times are MongoDB's, as the command wrote them)."""
    expires, polled = holder.get("expiresAt"), holder.get("polledAt")
    return isinstance(expires, datetime) and isinstance(polled, datetime) and expires < polled


def stranded(token: str, attempt_id: str | None, grant: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A kept ticket's poll found its grant ``grant`` (the fence it issued: one per grant)
    half-done (the gate booked, a narrower level not): remember when, on MongoDB's clock —
    the first sighting of that grant only.

    Invariant: only the waiting holder as its entries name it; a sighting of this grant
    stays (a later poll measures from it how long it has stayed half-done), one of an
    earlier grant (undone and the ticket granted again since) is replaced, so a grant under
    way is never taken for one that stayed half-done.
    """
    return ({"_id": token, "attemptId": attempt_id, "state": "PENDING", "stranded.grant": {"$ne": grant}},
            {"$set": {"stranded.grant": grant}, "$currentDate": {"stranded.at": True}})


def unstranded(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The half-done grant was undone (the ticket queued again): a later one is measured anew."""
    return {"_id": token}, {"$unset": {"stranded": ""}}


def granted(query: dict[str, Any]) -> dict[str, Any]:
    """The filter of the holder ``query`` once granted (``HELD``)."""
    return {**query, "state": "HELD"}
