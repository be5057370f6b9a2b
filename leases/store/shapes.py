"""Named reads and writes of the short stored fields of queue tickets and gates.

A ticket repeats per waiting request inside its gate counter, so its stored fields keep
short names (:class:`leases.store.documents.TicketDoc`: ``t``, ``p``, ``u``, ``at``, ``seen``,
``ttl``, ``lvl``, ``bat``, ``w``, ``wt``, ``wp``, ``pc``, ``pn``, ``ms``), and so do the gate's
order-rule and estimate fields (``vt``, ``vf``, ``er``). The engine, the queue and the read
models outside the store read and write them through these functions instead of spelling
the keys at each use (the command builders in this package spell them, next to the
invariant each keeps). The stored names do not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from ..store.documents import CounterDoc, TicketDoc


def new_ticket(*, token: str, tenant: str, project: str, user: str, arrived: datetime | None,
               seen: datetime | None, ttl_ms: int, caps: dict[str, int], level: str,
               waker: str | None, attempt: str | None = None) -> TicketDoc:
    """A ticket for the gate's queue: the request ``token`` of ``tenant``/``project``/``user``,
    arrived at ``arrived`` and last kept alive at ``seen`` (default: ``arrived``), living
    ``ttl_ms`` without a keep-alive, also bound by the narrower levels' ``caps``, blocked
    last at ``level``; ``waker`` is its process's wake-up channel; ``attempt``: the
    ``attemptId`` of its holder document, so whoever frees a slot can book the ticket's
    entry for it (:mod:`leases.queue.grants`)."""
    return {"id": token, "t": tenant, "p": project, "u": user, "at": arrived, "seen": seen or arrived,
            "ttl": ttl_ms, "caps": caps, "lvl": level, "w": waker, "a": attempt}


def queue_of(gate: CounterDoc) -> list[TicketDoc]:
    """The gate's queue as the document says (empty when it has none)."""
    return list(gate.get("queue") or ())


def has_waiters(gate: Mapping[str, Any] | None) -> bool:
    """Whether anyone waits at the gate: tickets in its head (``queue``) or its backlog
    (counted in ``bk``: :mod:`leases.queue.backlog`)."""
    if not gate:
        return False
    backlog = gate.get("bk")
    return bool(gate.get("queue")) or (isinstance(backlog, int) and not isinstance(backlog, bool) and backlog > 0)


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


# Ticket and gate documents are read as plain mappings too (a stand-in ticket, a projected
# gate), so the accessors take any mapping; each keeps the default its callers relied on.
Doc = Mapping[str, Any]


def tenant(ticket: Doc) -> str:
    """The waiting request's tenant (``t``; ``""`` when missing)."""
    return ticket.get("t", "")


def project(ticket: Doc) -> str:
    """The waiting request's project (``p``; ``""`` when missing)."""
    return ticket.get("p", "")


def user(ticket: Doc) -> str:
    """The waiting request's user (``u``; ``""`` when missing)."""
    return ticket.get("u", "")


def owner(ticket: Doc) -> tuple[str, str, str]:
    """Who waits: (tenant, project, user)."""
    return tenant(ticket), project(ticket), user(ticket)


def blocked_level(ticket: Doc) -> str | None:
    """The level that blocked the ticket last (``lvl``), or None."""
    return ticket.get("lvl")


def blocked_since(ticket: Doc) -> datetime | None:
    """When the ticket last found one of its own narrower levels full (``bat``), or None."""
    return ticket.get("bat")


def attempt(ticket: Doc) -> str | None:
    """The ``attemptId`` of the ticket's holder document as queued (None: queued before
    tickets carried it, or by an older process)."""
    value = ticket.get("a")
    return value if isinstance(value, str) and value else None


def narrow_caps(ticket: Doc) -> dict[str, Any]:
    """The narrower levels' caps the ticket must also fit (empty: the gate is its only cap)."""
    caps = ticket.get("caps")
    return caps if isinstance(caps, dict) else {}


def waker(ticket: Doc) -> str | None:
    """The waiting process's wake-up channel (``w``); None for a kept (polled) ticket."""
    return ticket.get("w")


def tenant_weight(ticket: Doc) -> Any:
    """Its tenant's weight as stored (``wt``; the order rule validates it)."""
    return ticket.get("wt")


def project_weight(ticket: Doc) -> Any:
    """Its project's weight as stored (``wp``; the order rule validates it)."""
    return ticket.get("wp")


def priority_rank(ticket: Doc) -> int:
    """Its priority class rank (``pc``), 0 the highest (and the default)."""
    return int(ticket.get("pc") or 0)


def priority_name(ticket: Doc) -> str | None:
    """Its priority class's name (``pn``), or None."""
    return ticket.get("pn")


def max_starvation_ms(ticket: Doc) -> Any:
    """Its definition's ``maxStarvationMs`` as stored (``ms``), or None."""
    return ticket.get("ms")


def tenant_passes(gate: Doc) -> dict[str, Any]:
    """The gate's virtual times per tenant and project (``vt``; empty when none)."""
    return dict(gate.get("vt") or {})


def passes_floor(gate: Doc) -> float:
    """The gate's virtual-time floor (``vf``; 0 when none)."""
    return float(gate.get("vf") or 0.0)


def estimate_ratios(gate: Doc) -> Any:
    """The gate's recent ratios of estimated to actual waits (``er``) as stored."""
    return gate.get("er") or ()
