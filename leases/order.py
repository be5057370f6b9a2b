"""Who goes next: the one rule that orders the waiting tickets of a gate counter.

Pure functions over the gate counter's document (its booking entries and its queue) and
MongoDB's clock; no I/O, so the rule is table-tested and lives nowhere else.

The rule: the next slot goes to the waiting tenant that holds the fewest slots of the
resource (ties: the oldest ticket); within a tenant, the oldest ticket first. A ticket that
its own tenant, project or user cap blocks is skipped, so it never holds back tickets that
could run (no head-of-line blocking). A ticket not kept alive within its TTL is stale: its
waiter is gone and it is ignored until somebody prunes it; one not seen for half its TTL
goes after the fresh ones (its waiter is probably gone).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .slots import parts_of


@dataclass
class Occupancy:
    """Slots held at a resource per tenant, (tenant, project) and (tenant, user)."""

    tenant: Counter = field(default_factory=Counter)
    project: Counter = field(default_factory=Counter)
    user: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, bookings: Iterable[str]) -> "Occupancy":
        held = cls()
        for booking in bookings:
            held.add(*parts_of(booking))
        return held

    def add(self, tenant: str, project: str, user: str) -> None:
        self.tenant[tenant] += 1
        self.project[(tenant, project)] += 1
        self.user[(tenant, user)] += 1

    def fits(self, ticket: dict[str, Any]) -> bool:
        """Whether the ticket's own narrower caps leave it room."""
        caps = ticket.get("caps") or {}
        t, p, u = ticket.get("t", ""), ticket.get("p", ""), ticket.get("u", "")
        return not (("tenant" in caps and self.tenant[t] >= caps["tenant"])
                    or ("project" in caps and self.project[(t, p)] >= caps["project"])
                    or ("user" in caps and self.user[(t, u)] >= caps["user"]))


# A ticket that found a narrower level full although the gate's entries said it fits (a
# booking the gate cannot see, e.g. another lease name on the same resource) sits out this
# long, so it cannot hold the turn while others could run.
BLOCKED_PAUSE = timedelta(milliseconds=300)


def sits_out(ticket: dict[str, Any], now: datetime) -> bool:
    """Whether a ticket recently found one of its own narrower levels full."""
    blocked_at = ticket.get("bat")
    return (blocked_at is not None and ticket.get("lvl") in (ticket.get("caps") or {})
            and blocked_at + BLOCKED_PAUSE > now)


def is_suspect(ticket: dict[str, Any], now: datetime) -> bool:
    """A ticket that missed its keep-alive (not seen for half its TTL): its waiter is
    probably dead. It goes after every fresh ticket, so a killed waiter picked for a free
    slot holds it idle for at most half a ticket TTL, not a whole one."""
    seen = ticket.get("seen") or ticket.get("at")
    return seen is None or seen + timedelta(milliseconds=int(ticket.get("ttl", 0)) / 2) < now


def is_stale(ticket: dict[str, Any], now: datetime) -> bool:
    """A ticket whose waiter did not keep it alive within its TTL (MongoDB's clock)."""
    seen = ticket.get("seen") or ticket.get("at")
    return seen is None or seen + timedelta(milliseconds=int(ticket.get("ttl", 0))) < now


def _rank_key(ticket: dict[str, Any], held: Occupancy) -> tuple:
    # The fairness rule: fewest held by the ticket's tenant, then the oldest ticket.
    return (held.tenant[ticket.get("t", "")], ticket.get("at"), ticket.get("id", ""))


def ranked(gate: dict[str, Any], now: datetime, limit: int | None = None) -> list[dict[str, Any]]:
    """The live tickets in the order they would be granted if slots kept freeing.

    Each pick counts as held for the picks after it, so tenants alternate. Tickets that
    their own caps block at every step come last, oldest first. ``limit`` stops early.
    """
    held = Occupancy.of(gate.get("holders") or ())
    remaining = [t for t in gate.get("queue") or () if not is_stale(t, now)]
    out: list[dict[str, Any]] = []
    while remaining and (limit is None or len(out) < limit):
        eligible = [t for t in remaining if held.fits(t) and not sits_out(t, now)]
        if not eligible:
            break
        eligible = [t for t in eligible if not is_suspect(t, now)] or eligible
        pick = min(eligible, key=lambda t: _rank_key(t, held))
        out.append(pick)
        remaining.remove(pick)
        held.add(pick.get("t", ""), pick.get("p", ""), pick.get("u", ""))
    if limit is None or len(out) < limit:
        out.extend(sorted(remaining, key=lambda t: (t.get("at"), t.get("id", "")))[
            : None if limit is None else limit - len(out)])
    return out


def next_grants(gate: dict[str, Any], now: datetime) -> list[str]:
    """The tickets that may take the gate's free slots now (ids, best first).

    Only tickets that fit their own caps count, so a blocked ticket never takes a turn.
    """
    free = int(gate.get("cap", 0)) - len(gate.get("holders") or ())
    if free <= 0:
        return []
    held = Occupancy.of(gate.get("holders") or ())
    chosen = []
    for ticket in ranked(gate, now, limit=free):
        if not held.fits(ticket) or sits_out(ticket, now):
            break
        chosen.append(ticket["id"])
        held.add(ticket.get("t", ""), ticket.get("p", ""), ticket.get("u", ""))
    return chosen


def position(gate: dict[str, Any], ticket_id: str, now: datetime) -> int | None:
    """1-based place of ``ticket_id`` in the grant order; None when it is not queued (live)."""
    for index, ticket in enumerate(ranked(gate, now), start=1):
        if ticket.get("id") == ticket_id:
            return index
    return None


def blocking_level(gate: dict[str, Any], ticket: dict[str, Any], now: datetime) -> str:
    """The level that holds ``ticket`` back now: its narrowest own cap that the gate's
    entries show full, else the narrower level it last found full (while it sits out), else
    the gate's own level (its turn has not come)."""
    held = Occupancy.of(gate.get("holders") or ())
    caps = ticket.get("caps") or {}
    t, p, u = ticket.get("t", ""), ticket.get("p", ""), ticket.get("u", "")
    for level, count in (("user", held.user[(t, u)]), ("project", held.project[(t, p)]),
                         ("tenant", held.tenant[t])):
        if level in caps and count >= caps[level]:
            return level
    if sits_out(ticket, now):
        return str(ticket.get("lvl"))
    return str(gate.get("level") or "global")


def stale_ids(gate: dict[str, Any], now: datetime) -> list[str]:
    """Ids of the tickets nobody keeps alive any more."""
    return [t["id"] for t in gate.get("queue") or () if is_stale(t, now)]
