"""A place kept in a resource's queue for a caller that polls it (the HTTP protocol)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from leases import estimates, order
from leases.definitions import LeaseDefinition
from leases.documents import CounterDoc, TicketDoc

if TYPE_CHECKING:
    from .funnel import _Blocked


@dataclass(frozen=True)
class Ticket:
    """A place in a resource's queue, kept for a caller that polls it (the HTTP protocol).

    ``deadline`` is on MongoDB's clock: a ticket not polled by then is dropped (EXPIRED).
    ``level`` is the level that blocked it last; ``position`` its place in the grant order.
    """

    id: str
    resource: str
    lease_name: str
    level: str
    position: int | None
    server_time: datetime
    deadline: datetime
    estimated_grant_at: datetime | None = None

    @classmethod
    def of(cls, token: str, definition: LeaseDefinition, gate: CounterDoc, blocked: _Blocked | None) -> "Ticket":
        now = gate["clock"]
        mine: TicketDoc = next((t for t in gate.get("queue") or () if t.get("id") == token), TicketDoc())
        seen = mine.get("seen") or now
        return cls(id=token, resource=definition.resource, lease_name=definition.name,
                   level=order.blocking_level(gate, mine, now) if mine else (
                       blocked.spec.level if blocked else "global"),
                   position=order.position(gate, token, now), server_time=now,
                   deadline=seen + timedelta(milliseconds=int(mine.get("ttl") or 0)),
                   estimated_grant_at=estimates.grant_at(gate, token, now))
