"""When will my turn come: the estimated grant time of a waiting ticket.

Pure, like the order rule it builds on: from the gate document alone (its recent hold
durations ``holds``, its cap and holders, and the place the order rule gives the ticket)
and MongoDB's clock. No extra read: every waiter already has the gate from the command it
last sent.

At steady state the gate's ``cap`` slots turn over once per mean hold, so one frees every
``hold ÷ cap`` on average, and the next one is half that away. A ticket with ``k`` tickets
ahead of it beyond the free slots is granted after about ``(k + ½) · hold ÷ cap``. Tickets
that arrive later and rank ahead (a higher class, a tenant further below its share) make
the real wait longer; the estimate is refreshed with every poll.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from statistics import median
from typing import Any

from . import order

# Recent hold durations kept on the gate (ms): enough for a stable median, small enough to
# follow a change of workload within a few dozen grants.
HOLDS_KEPT = 16


def mean_hold_ms(gate: dict[str, Any]) -> float | None:
    """The typical hold at this gate from its recent releases (median, ms); None if none."""
    holds = [h for h in gate.get("holds") or () if isinstance(h, (int, float)) and not isinstance(h, bool) and h >= 0]
    return float(median(holds)) if holds else None


def wait_ms(gate: dict[str, Any], ticket_id: str, now: datetime) -> float | None:
    """Estimated milliseconds from ``now`` until ``ticket_id`` is granted; None when the
    gate has no hold history yet or the ticket is not queued (live)."""
    place = order.position(gate, ticket_id, now)
    return None if place is None else wait_ms_at_place(gate, place)


def wait_ms_at_place(gate: dict[str, Any], place: int) -> float | None:
    """Estimated milliseconds until the ticket at 1-based ``place`` of the grant order is
    granted; None when the gate has no hold history yet."""
    hold = mean_hold_ms(gate)
    if hold is None:
        return None
    cap = max(1, int(gate.get("cap", 1)))
    free = max(0, cap - len(gate.get("holders") or ()))
    ahead = place - 1 - free  # tickets that need a slot to free before this one's turn
    if ahead < 0:
        return 0.0
    return (ahead + 0.5) * hold / cap


def grant_at(gate: dict[str, Any], ticket_id: str, now: datetime) -> datetime | None:
    """The estimated grant time of ``ticket_id`` on MongoDB's clock (None: unknown)."""
    ms = wait_ms(gate, ticket_id, now)
    return None if ms is None else now + timedelta(milliseconds=ms)


def held_ms(held_at: datetime | None) -> float | None:
    """How long a holder released by token (no process kept its grant time) held its slot:
    this host's clock against the server's ``heldAt``. Only ever an estimate's input, never
    a TTL decision; a skewed clock gives an implausible value, which is left out."""
    if held_at is None:
        return None
    now = datetime.now(timezone.utc) if held_at.tzinfo is not None else datetime.now(timezone.utc).replace(tzinfo=None)
    ms = (now - held_at).total_seconds() * 1000
    return ms if 0 <= ms <= 7 * 24 * 3600 * 1000 else None


def grant_at_place(gate: dict[str, Any], place: int, now: datetime) -> datetime | None:
    """The estimated grant time of the ticket at ``place`` (None: unknown)."""
    ms = wait_ms_at_place(gate, place)
    return None if ms is None else now + timedelta(milliseconds=ms)


def hold_update(hold_ms: float | None) -> dict[str, Any]:
    """The update operators that record one hold duration on the gate (merged into the
    release's own update, so it costs no command)."""
    if hold_ms is None or hold_ms < 0:
        return {}
    return {"$push": {"holds": {"$each": [round(float(hold_ms), 1)], "$slice": -HOLDS_KEPT}}}
