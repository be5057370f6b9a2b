"""The shapes of the engine's MongoDB documents, as they cross module boundaries.

A holder document is written by the acquisition funnel (``leases.service``,
``leases.store.holder_commands``), renewed and ended by ``leases.engine.holders``, read by the reaper, the
dispatcher and the operator views; a counter document is booked by ``leases.queue.slots`` and
queued on by ``leases.queue.waiting``; a pod document is written by ``leases.pods.leases`` and
judged by ``leases.pods.liveness``. These ``TypedDict`` s name their fields once, for the
type checker and for the reader. ``total=False``: a projection returns only some fields,
and documents written by older versions may lack newer ones. Times are MongoDB's clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict


class HolderDoc(TypedDict, total=False):
    """``resource_lease_holders``: one per lease attempt; a lease once ``state`` is ``HELD``."""

    _id: str                    # the lease token
    state: str                  # PENDING (booking or waiting) or HELD
    attemptId: str              # this writing of the document; its booking entries name it
    resource: str
    leaseName: str
    type: str                   # the handler type
    tenantId: str
    projectId: str
    userId: str
    holderRef: str
    pod: str                    # "" for a detached (HTTP) holder: only the idle reap applies
    podBound: bool
    priority: str | None
    ttlSeconds: int
    intervalSeconds: int        # the renewal interval the server issues (HTTP)
    keys: list[str]             # the counters it sets out to book, narrow to wide
    levels: list[str]           # the counters it books (set when HELD)
    payload: dict[str, Any]     # what the revocation handler gets
    acquiredAt: datetime
    heldAt: datetime
    lastSeenAt: datetime        # the last renewal (or the grant)
    expiresAt: datetime         # the deadline: past it the holder is reaped
    priorExpiresAt: datetime    # the deadline the last renewal replaced
    polledAt: datetime          # the last poll of a kept ticket (also set when it is kept)
    stranded: dict[str, Any]    # a kept ticket's grant seen half-done: {grant: its fence, at}
    fence: str | None           # the fence its grant issued (leases.store.fence_codec), set when HELD


class TicketDoc(TypedDict, total=False):
    """One waiting ticket inside a gate counter's ``queue`` (see ``leases.queue.waiting``)."""

    id: str                     # the holder token it is granted as
    t: str                      # tenant, project, user
    p: str
    u: str
    # The order rule reads a ticket without either as stale (leases.queue.order.is_stale).
    at: datetime | None         # arrival
    seen: datetime | None       # the last keep-alive
    ttl: int                    # milliseconds it lives without a keep-alive
    caps: dict[str, int]        # the narrower levels' caps it must also fit
    lvl: str                    # the level that blocked it last
    bat: datetime               # when it last found one of its own narrower levels full
    w: str | None               # the waiting process's wake-up channel
    a: str | None               # its holder's attemptId (the entry a direct grant books)
    # Its narrower levels as the waiter's view had them, so a direct grant books them in the
    # same bulk (leases.queue.grants): [{k: key, l: level, s: scope, c: cap}], narrow first;
    # and the view's lease and load time (the cap stamps it obeys). Absent: it books itself.
    lv: list[dict[str, Any]]
    ln: str
    la: datetime | None
    # The order rule's inputs, resolved when it queued (leases.queue.shares.ticket_fields):
    wt: float                   # its tenant's weight
    wp: float                   # its project's weight
    pc: int                     # its priority class rank, 0 the highest
    pn: str                     # the priority class's name
    ms: int                     # its definition's maxStarvationMs


class CounterDoc(TypedDict, total=False):
    """``resource_lease_counters``: one per (resource, level, scope)."""

    _id: str                    # <resource>|<level>|<scope>
    resource: str
    level: str
    scope: str
    tenantId: str | None
    cap: int
    count: int                  # always len(holders)
    holders: list[str]          # one booking entry tenant/project/user/attempt/token per slot
    queue: list[TicketDoc]      # on the gate only
    # The gate's records for the order rule and the estimates (leases.queue.order, leases.queue.estimates):
    vt: dict[str, float]        # passes per tenant "t", project "t/p" and project floor "t/"
    vf: float                   # the pass of the last tenant grant
    holds: list[float]          # recent hold durations (ms)
    er: list[float]             # recent actual ÷ estimated waits
    updatedAt: datetime
    clock: datetime             # stamped by the command that returned the document
    checkedAt: datetime         # the last repair check
    # The fence counter's slots (leases.queue.fences): "s<slot>" -> {"e": entry, "g": generation}.
    fence: dict[str, dict[str, Any]]


class PodDoc(TypedDict, total=False):
    """``lease_pods``: one per pod (web process or worker) and its server-issued pod lease."""

    _id: str
    leaseId: str
    endpoint: str
    intervalSeconds: int
    expiryDeadline: datetime
    lastReceiptAt: datetime
    registeredAt: datetime
    stopped: bool
    stoppedAt: datetime | None
