"""Named reads and writes of the queue ticket's short fields, for the engine's modules.

A ticket repeats per waiting request inside its gate counter, so its stored fields keep
short names (:class:`leases.store.documents.TicketDoc`: ``t``, ``p``, ``u``, ``at``, ``seen``,
``ttl``, ``lvl``, ``w``, …); the engine writes and reads them through these functions
instead of spelling the keys at each use. The stored names do not change.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..store.documents import CounterDoc, TicketDoc


def new_ticket(*, token: str, tenant: str, project: str, user: str, arrived: datetime | None,
               seen: datetime | None, ttl_ms: int, caps: dict[str, int], level: str,
               waker: str | None) -> TicketDoc:
    """A ticket for the gate's queue: the request ``token`` of ``tenant``/``project``/``user``,
    arrived at ``arrived`` and last kept alive at ``seen`` (default: ``arrived``), living
    ``ttl_ms`` without a keep-alive, also bound by the narrower levels' ``caps``, blocked
    last at ``level``; ``waker`` is its process's wake-up channel."""
    return {"id": token, "t": tenant, "p": project, "u": user, "at": arrived, "seen": seen or arrived,
            "ttl": ttl_ms, "caps": caps, "lvl": level, "w": waker}


def queue_of(gate: CounterDoc) -> list[TicketDoc]:
    """The gate's queue as the document says (empty when it has none)."""
    return list(gate.get("queue") or ())


def ticket_in(gate: CounterDoc, token: str) -> TicketDoc | None:
    """The ticket of request ``token`` in the gate's queue, or None when it is not queued."""
    return next((t for t in gate.get("queue") or () if t.get("id") == token), None)


def arrived_at(ticket: TicketDoc) -> datetime | None:
    """When the ticket's request first asked (its place among its tenant's tickets)."""
    return ticket.get("at")


def ticket_deadline(ticket: TicketDoc, now: datetime) -> datetime:
    """When the ticket is dropped unless kept alive: its last keep-alive (else ``now``) plus
    its TTL, both on MongoDB's clock."""
    seen = ticket.get("seen") or now
    return seen + timedelta(milliseconds=int(ticket.get("ttl") or 0))
