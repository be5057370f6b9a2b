"""A place kept in a resource's queue for a caller that polls it (the HTTP protocol)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..definitions.model import LeaseDefinition
from ..queue import backlog, estimates, order
from ..store.documents import CounterDoc, TicketDoc
from ..store.shapes import ticket_deadline, ticket_in

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
    #: The poll that answered it waited for its grant (a long poll) to its end: poll again now.
    waited: bool = False

    @classmethod
    def of(cls, token: str, definition: LeaseDefinition, gate: CounterDoc, blocked: _Blocked | None,
           backlogged: dict[str, Any] | None = None) -> "Ticket":
        """Where the ticket ``token`` stands at ``gate`` (as read, with its ``clock``): in its
        head, or in its backlog (placed after the head, in arrival order: a count, and a read
        of its backlog document unless the caller passes it, ``backlogged``).

        Raises:
            pymongo.errors.PyMongoError: the store failed (reading the backlog).
        """
        now = gate["clock"]
        mine: TicketDoc = ticket_in(gate, token) or TicketDoc()
        position = order.position(gate, token, now)
        if not mine:
            waiting_back = backlog.find(gate["_id"], token, head=len(gate.get("queue") or ()), doc=backlogged)
            if waiting_back is not None:
                mine, position = waiting_back
        return cls(id=token, resource=definition.resource, lease_name=definition.name,
                   level=order.blocking_level(gate, mine, now) if mine else (
                       blocked.spec.level if blocked else "global"),
                   position=position, server_time=now,
                   deadline=ticket_deadline({**mine, "seen": order.last_seen(mine)} if mine else mine, now),
                   estimated_grant_at=estimates.grant_at(gate, token, now))
