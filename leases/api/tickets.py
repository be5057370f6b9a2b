"""Wait tickets over HTTP: an acquire that outwaits its bound keeps its place in the queue.

``POST /api/v1/leases`` answers ``202`` with a ticket when no slot freed within the bounded
wait; the client polls ``GET /api/v1/tickets/{id}`` every ``pollIntervalSeconds`` (each poll
keeps the ticket alive and takes the slot when it is the ticket's turn, answering the
acquire's ``201`` body) and may give up with ``DELETE``. ``?waitMs=`` makes a poll wait for
the grant when it is expected within that long (a long poll: the slot is taken the moment a
release grants it, not at the next poll). A ticket not polled within three
intervals (``deadline``, MongoDB's clock) is dropped: ``EXPIRED``, terminal, as for leases.

Every call is bound to the API key's tenant (and project): the key's scope is part of every
filter, so another tenant's ticket answers like one that never existed (``STALE_LEASE``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pymongo.errors

from leases import service
from leases.conf import lease_settings
from leases.engine import holders
from leases.errors import LeaseUnavailable, StaleLease
from leases.ids import validation
from leases.store import client as store

from . import protocol
from .models import ApiKey


@dataclass(frozen=True)
class TicketAnswer:
    """A place in the queue, as the ``Ticket`` schema of the OpenAPI document shows it."""

    ticket: service.Ticket
    poll_seconds: int

    @property
    def estimated_wait_seconds(self) -> float | None:
        """Seconds from the server time until the estimated grant (None: no estimate yet)."""
        ticket = self.ticket
        if ticket.estimated_grant_at is None:
            return None
        return max(0.0, (ticket.estimated_grant_at - ticket.server_time).total_seconds())

    @property
    def retry_after(self) -> int:
        """``Retry-After``: 0 after a poll that waited for the grant to the end of its wait
        (poll again now); else the estimated wait, but never later than the poll interval (a
        ticket must be polled to stay alive) and never below one second."""
        if self.ticket.waited:
            return 0
        wait = self.estimated_wait_seconds
        if wait is None:
            return self.poll_seconds
        return max(1, min(self.poll_seconds, math.ceil(wait)))

    @property
    def location(self) -> str:
        return f"/api/v1/tickets/{self.ticket.id}"

    def to_json(self) -> dict[str, Any]:
        ticket = self.ticket
        return {
            "ticket": ticket.id,
            "resource": ticket.resource,
            "leaseName": ticket.lease_name,
            "position": ticket.position,
            "level": ticket.level,
            "pollIntervalSeconds": self.poll_seconds,
            "deadline": protocol.iso(ticket.deadline),
            "serverTime": protocol.iso(ticket.server_time),
            "estimatedGrantAt": None if ticket.estimated_grant_at is None else protocol.iso(ticket.estimated_grant_at),
            "estimatedWaitSeconds": None if self.estimated_wait_seconds is None else round(self.estimated_wait_seconds, 3),
        }


def answer(ticket: service.Ticket) -> TicketAnswer:
    """The HTTP view of ``ticket`` with the server-issued poll interval."""
    return TicketAnswer(ticket=ticket, poll_seconds=protocol.ticket_poll_seconds())


def long_poll_bound_ms() -> int:
    """The longest a poll waits for its grant: ``LEASES_HTTP_MAX_WAIT_MS``, and never more than
    two poll intervals — the poll keeps the ticket for three from its start, so the poll that
    ends the wait (which keeps it again) comes with one interval to spare."""
    return max(0, min(int(lease_settings.HTTP_MAX_WAIT_MS), protocol.ticket_keep_ms() - 1000 * protocol.ticket_poll_seconds()))


def poll(*, key: ApiKey, ticket_id: str, wait_ms: int = 0) -> "TicketAnswer | protocol.Grant":
    """Keep the ticket alive; the lease (acquire's grant) once it is the ticket's turn.

    A ticket granted before answers the same lease again, so a lost answer can be fetched
    by polling once more. ``wait_ms`` (at most :func:`long_poll_bound_ms`): wait that long for
    the grant when it is expected within it (a long poll, :func:`leases.engine.kept.resume`).

    Raises:
        InvalidLeaseRequest: malformed ticket id (before any query).
        StaleLease: no such ticket for this key (including other tenants' tickets).
        LeaseExpired: the ticket was dropped (not polled in time, abandoned) or its lease ended.
        LeaseUnavailable: the store is unreachable or the configuration is broken.
    """
    validation.token(ticket_id)
    scope = protocol.key_scope(key)
    result = service.resume(ticket_id, scope=scope, keep_ms=protocol.ticket_keep_ms(),
                            wait_ms=min(max(0, int(wait_ms)), long_poll_bound_ms()))
    if isinstance(result, service.Ticket):
        return answer(result)
    return protocol.grant_of(result)


def abandon(*, key: ApiKey, ticket_id: str) -> protocol.ReleaseResult | None:
    """Give up the ticket (or release the lease it was granted as).

    Returns:
        None when this call ended it (HTTP 204); for a ticket that had ended before, the
        answer a lease release gives for an ended token (``alreadyReleased`` with the reason).

    Raises:
        InvalidLeaseRequest: malformed ticket id (before any query).
        StaleLease: no such ticket for this key (never issued, another tenant's, or so old
            that its tombstone expired).
        LeaseUnavailable: the store is unreachable.
    """
    validation.token(ticket_id)
    scope = protocol.key_scope(key)
    if service.abandon(ticket_id, scope=scope):
        return None
    try:
        tombstone = store.tombstones().find_one(holders.scoped(ticket_id, scope), {"reason": 1})
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc)) from None
    if tombstone is None:
        raise StaleLease(f"unknown ticket {ticket_id}")
    return protocol.ReleaseResult(token=ticket_id, released=False, reason=tombstone.get("reason"))
