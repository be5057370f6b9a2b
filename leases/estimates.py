"""When will my turn come: the estimated grant time of a waiting ticket.

Pure, like the order rule it builds on: from the gate document alone (its recent hold
durations ``holds``, its cap and holders, and the place the order rule gives the ticket)
and MongoDB's clock. No extra read: every waiter already has the gate from the command it
last sent.

At steady state the gate's ``cap`` slots turn over once per typical hold, so one frees
every ``hold ÷ cap``. The estimate walks the turnover forward — oldest holder releases,
the order rule picks, whoever released asks again — until the ticket is picked, and so
counts the tickets that will pass it later (a higher class, a tenant below its weighted
share), not only those ahead of it now. The estimate is refreshed with every poll.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from statistics import median
from typing import Any

from . import order
from .slots import parts_of

# Recent hold durations kept on the gate (ms): enough for a stable median, small enough to
# follow a change of workload within a few dozen grants.
HOLDS_KEPT = 16


def mean_hold_ms(gate: dict[str, Any]) -> float | None:
    """The typical hold at this gate from its recent releases (median, ms); None if none."""
    return order.typical_hold_ms(gate)


def wait_ms(gate: dict[str, Any], ticket_id: str, now: datetime) -> float | None:
    """Estimated milliseconds from ``now`` until ``ticket_id`` is granted; None when the
    gate has no hold history yet or the ticket is not queued (live).

    The turnover walk (:func:`raw_wait_ms`) times the gate's own record of how its recent
    estimates came out (:func:`calibration`): a slot is idle between a release and the next
    grant, and a busy host stretches that; the record says by how much, here.
    """
    raw = raw_wait_ms(gate, ticket_id, now)
    return None if raw is None else raw * calibration(gate)


def calibration(gate: dict[str, Any]) -> float:
    """Median of actual ÷ estimated wait over the gate's recent grants (``er``); 1 until
    three are on record."""
    ratios = [r for r in gate.get("er") or () if isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0]
    return float(median(ratios)) if len(ratios) >= 3 else 1.0


def outcome_update(raw_ms: float | None, actual_ms: float) -> dict[str, Any]:
    """The update operators that record how one estimate came out (merged into the grant's
    booking update: no command of its own). Waits under 10 ms estimated say nothing."""
    if raw_ms is None or raw_ms < 10:
        return {}
    ratio = min(5.0, max(0.2, actual_ms / raw_ms))
    return {"$push": {"er": {"$each": [round(ratio, 3)], "$slice": -HOLDS_KEPT}}}


def raw_wait_ms(gate: dict[str, Any], ticket_id: str, now: datetime) -> float | None:
    """The turnover walk's estimate, before calibration.

    The slots are turned over one release at a time, oldest holder first, and each freed
    slot goes where the order rule (``leases.order.pick``) sends it. Whoever releases asks
    again at once (a ticket of the same tenant and project at the back): at steady state
    that is what keeps a heavier tenant's tickets passing a lighter one's, which the queue
    as it stands does not show. A ticket ``k`` releases away is granted after about
    ``(k − ½) · hold ÷ cap``; a one-off burst is over-estimated by this, never under.
    """
    hold = mean_hold_ms(gate)
    if hold is None:
        return None
    steps = releases_until(gate, ticket_id, now)
    if steps is None:
        return None
    return _steps_ms(steps, hold, max(1, int(gate.get("cap", 1))))


# A queue this long is estimated by its place alone: the turnover walk would cost more
# than a keep-alive is worth.
MAX_WALK_TICKETS = 200
MAX_WALK_STEPS = 2000


def releases_until(gate: dict[str, Any], ticket_id: str, now: datetime) -> int | None:
    """How many releases until ``ticket_id`` is picked (0: a free slot is its now); None
    when it is not queued (live) or not reached within the walk's bound."""
    live = [t for t in gate.get("queue") or () if not order.is_stale(t, now)]
    if not any(t.get("id") == ticket_id for t in live):
        return None
    if len(live) > MAX_WALK_TICKETS:
        return _by_place(gate, order.position(gate, ticket_id, now))
    for step, picked in _turnover(gate, live, now):
        if picked == ticket_id:
            return step
    return None


def releases_all(gate: dict[str, Any], now: datetime) -> dict[str, int]:
    """:func:`releases_until` of every live ticket of the gate from ONE walk (a listing
    asks for all of them; the walk does not depend on which ticket is asked about).
    Tickets the walk does not reach are absent."""
    live = [t for t in gate.get("queue") or () if not order.is_stale(t, now)]
    if len(live) > MAX_WALK_TICKETS:
        return {str(t.get("id")): steps for index, t in enumerate(order.ranked(gate, now), start=1)
                if (steps := _by_place(gate, index)) is not None}
    wanted = {t.get("id") for t in live}
    found: dict[str, int] = {}
    for step, picked in _turnover(gate, live, now):
        if picked in wanted and picked not in found:
            found[str(picked)] = step
            if len(found) == len(wanted):
                break
    return found


def _by_place(gate: dict[str, Any], place: int | None) -> int | None:
    """A long queue's estimate from the place alone (the free slots go first)."""
    if place is None:
        return None
    cap = max(1, int(gate.get("cap", 1)))
    return max(0, place - max(0, cap - len(gate.get("holders") or ())))


def _turnover(gate: dict[str, Any], live: list[dict[str, Any]], now: datetime) -> Iterator[tuple[int, Any]]:
    """The turnover walk: yields ``(releases so far, id of the ticket picked)`` for each
    pick, in order, until nothing can be picked or the walk's bound is reached."""
    cap = max(1, int(gate.get("cap", 1)))
    holders = list(gate.get("holders") or ())
    # Attributes a re-asking holder's ticket gets: those of a queued ticket of the same
    # tenant and project (weights, class), else the defaults.
    like = {(t.get("t"), t.get("p")): t for t in live}
    held = order.Occupancy.of(holders)
    passes = order.Passes.of(gate)
    lead = order.starvation_lead(gate)
    queue = [dict(t) for t in live]
    owners = [parts_of(b) for b in holders]  # (tenant, project, user) per slot, oldest first
    far = now + timedelta(days=3650)
    serial = 0
    for step in range(MAX_WALK_STEPS + 1):
        while len(owners) < cap:
            chosen = order.pick(queue, held, passes, now, lead)
            if chosen is None:
                break
            yield step, chosen.get("id")
            queue.remove(chosen)
            held.add(chosen.get("t", ""), chosen.get("p", ""), chosen.get("u", ""))
            passes.charge(chosen, queue)
            owners.append((chosen.get("t", ""), chosen.get("p", ""), chosen.get("u", "")))
        if not owners:
            return  # nothing to release and nothing picked: blocked by its own caps
        t, p, u = owners.pop(0)
        held.tenant[t] -= 1
        held.project[(t, p)] -= 1
        held.user[(t, u)] -= 1
        serial += 1
        template = like.get((t, p), {})
        queue.append({**{k: template[k] for k in ("wt", "wp", "pc", "caps") if k in template},
                      "id": f"\x00again{serial}", "t": t, "p": p, "u": u, "at": far + timedelta(seconds=serial),
                      "seen": now, "ttl": 10**9})


def grant_times(gate: dict[str, Any], now: datetime) -> dict[str, datetime]:
    """:func:`grant_at` of every live ticket of the gate, from one walk (unknown: absent)."""
    hold = mean_hold_ms(gate)
    if hold is None:
        return {}
    cap = max(1, int(gate.get("cap", 1)))
    scale = calibration(gate)
    return {ticket_id: now + timedelta(milliseconds=_steps_ms(steps, hold, cap) * scale)
            for ticket_id, steps in releases_all(gate, now).items()}


def _steps_ms(steps: int, hold: float, cap: int) -> float:
    """Milliseconds until the ``steps``-th release frees a slot (0: one is free now)."""
    return 0.0 if steps == 0 else (steps - 0.5) * hold / cap


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
    now = datetime.now(UTC) if held_at.tzinfo is not None else datetime.now(UTC).replace(tzinfo=None)
    ms = (now - held_at).total_seconds() * 1000
    return ms if 0 <= ms <= 7 * 24 * 3600 * 1000 else None


def hold_update(hold_ms: float | None) -> dict[str, Any]:
    """The update operators that record one hold duration on the gate (merged into the
    release's own update, so it costs no command)."""
    if hold_ms is None or hold_ms < 0:
        return {}
    return {"$push": {"holds": {"$each": [round(float(hold_ms), 1)], "$slice": -HOLDS_KEPT}}}
