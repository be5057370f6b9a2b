"""When will my turn come: the estimated grant time of a waiting ticket.

Pure, like the order rule it builds on: from the gate document alone (its recent hold
durations ``holds``, its cap and holders, and the place the order rule gives the ticket)
and MongoDB's clock. No extra read: every waiter already has the gate from the command it
last sent.

At steady state the gate's ``cap`` slots turn over once per typical hold, so one frees
every ``hold ÷ cap``. The estimate walks the turnover forward — oldest holder releases,
the order rule picks, whoever released asks again — until the ticket is picked, and so
counts the tickets that will pass it later (a higher class, a tenant below its weighted
share), not only those ahead of it now. The walk's clock moves on by ``hold ÷ cap`` per
release, so a low class waiting under a flood of a higher one reaches its starvation
promotion in the walk as it will in fact. The estimate is refreshed with every poll.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from statistics import median
from typing import Any, cast

from ..store import shapes
from ..store.documents import CounterDoc, TicketDoc
from ..store.entries import parts_of
from . import order

# Recent hold durations kept on the gate (ms): enough for a stable median, small enough to
# follow a change of workload within a few dozen grants.
HOLDS_KEPT = 16


def mean_hold_ms(gate: CounterDoc) -> float | None:
    """The typical hold at this gate from its recent releases (median, ms); None if none."""
    return order.typical_hold_ms(gate)


def held_at_least_ms(gate: CounterDoc, now: datetime) -> float | None:
    """How long every current holder of the gate has held at least (ms, on MongoDB's
    clock ``now``): since the gate's last booking change (``updatedAt``, stamped by every
    grant and every return), which is no earlier than the latest grant. None when the gate
    lists no holder or has no stamp."""
    changed = gate.get("updatedAt")
    if not gate.get("holders") or changed is None:
        return None
    return max(0.0, (now - changed).total_seconds() * 1000)


def overdue_hold_ms(gate: CounterDoc, now: datetime) -> float | None:
    """The current holders' remaining expected hold once every one of them has held longer
    than the gate's typical hold: about as long again as they have held (a hold that outlived
    the typical one says nothing better of its end). None while any of them may still be
    within the typical hold — the turnover walk's estimate stands then — or when the gate
    has no hold on record."""
    typical, held = mean_hold_ms(gate), held_at_least_ms(gate, now)
    if typical is None or held is None or held < typical:
        return None
    return held


def wait_ms(gate: CounterDoc, ticket_id: str, now: datetime) -> float | None:
    """Estimated milliseconds from ``now`` until ``ticket_id`` is granted; None when the
    gate has no hold history yet or the ticket is not queued (live).

    The turnover walk (:func:`raw_wait_ms`) times the gate's own record of how its recent
    estimates came out (:func:`calibration`): a slot is idle between a release and the next
    grant, and a busy host stretches that; the record says by how much, here.
    """
    raw = raw_wait_ms(gate, ticket_id, now)
    return None if raw is None else raw * calibration(gate)


def calibration(gate: CounterDoc) -> float:
    """Median of actual ÷ estimated wait over the gate's recent grants (``er``); 1 until
    three are on record."""
    ratios = [r for r in shapes.estimate_ratios(gate) if isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0]
    return float(median(ratios)) if len(ratios) >= 3 else 1.0


def outcome_update(raw_ms: float | None, actual_ms: float) -> dict[str, Any]:
    """The update operators that record how one estimate came out (merged into the grant's
    booking update: no command of its own). Waits under 10 ms estimated say nothing."""
    if raw_ms is None or raw_ms < 10:
        return {}
    ratio = min(5.0, max(0.2, actual_ms / raw_ms))
    return {"$push": {"er": {"$each": [round(ratio, 3)], "$slice": -HOLDS_KEPT}}}


def merged(*updates: dict[str, Any] | None) -> dict[str, Any]:
    """Update operators merged into one (``$push`` of holds and of outcomes side by side)."""
    out: dict[str, Any] = {}
    for update in updates:
        for op, fields in (update or {}).items():
            out[op] = {**out.get(op, {}), **fields}
    return out


def raw_wait_ms(gate: CounterDoc, ticket_id: str, now: datetime) -> float | None:
    """The turnover walk's estimate, before calibration.

    The slots are turned over one release at a time, oldest holder first, and each freed
    slot goes where the order rule (``leases.queue.order.pick``) sends it. Whoever releases asks
    again at once (a ticket like its tenant's and project's at the back, see
    :class:`_Reasking`): at steady state that is what keeps a heavier tenant's or a higher
    class's tickets passing the others, which the queue as it stands does not show. A ticket ``k`` releases away is granted after about
    ``(k − ½) · hold ÷ cap``; a one-off burst is over-estimated by this, never under.
    """
    hold = mean_hold_ms(gate)
    if hold is None:
        return None
    steps = releases_until(gate, ticket_id, now)
    if steps is None:
        return None
    return _steps_ms(steps, hold, max(1, int(gate.get("cap", 1))))


# The walk's bounds. It runs for every estimate (a waiter's enqueue, a ticket's status
# poll, a listing's gate), so it must stay cheap: a queue this long is estimated by its
# place alone, and the walk stops after this many releases (about 15 ms of CPU) or this
# many rankings of a ticket (a pick ranks the oldest ticket of each kind: see _Queue),
# whichever comes first. A ticket it did not reach by then is estimated from its
# starvation bound (:func:`_after_the_walk`), or not at all.
MAX_WALK_TICKETS = 200
MAX_WALK_STEPS = 500
MAX_WALK_RANKINGS = 10_000


def releases_until(gate: CounterDoc, ticket_id: str, now: datetime) -> int | None:
    """How many releases until ``ticket_id`` is picked (0: a free slot is its now); None
    when it is not queued (live) or not reached within the walk's bound."""
    live = [t for t in gate.get("queue") or () if not order.is_stale(t, now)]
    if not any(t.get("id") == ticket_id for t in live):
        return None
    if len(live) > MAX_WALK_TICKETS:
        return _by_place(gate, order.position(gate, ticket_id, now))
    picked: set[Any] = set()
    for step, chosen in _turnover(gate, live, now):
        if chosen == ticket_id:
            return step
        if chosen is None:  # the walk's budget ran out before it came to this ticket
            rest = [t for t in live if t.get("id") not in picked]
            return _after_the_walk(gate, rest, now, step).get(ticket_id)
        picked.add(chosen)
    return None


def releases_all(gate: CounterDoc, now: datetime) -> dict[str, int]:
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
        if picked is None:  # the walk's budget ran out: the rest from their starvation bounds
            found.update(_after_the_walk(gate, [t for t in live if str(t.get("id")) not in found], now, step))
            break
        if picked in wanted and picked not in found:
            found[str(picked)] = step
            if len(found) == len(wanted):
                break
    return found


def _by_place(gate: CounterDoc, place: int | None) -> int | None:
    """A long queue's estimate from the place alone (the free slots go first)."""
    if place is None:
        return None
    cap = max(1, int(gate.get("cap", 1)))
    return max(0, place - max(0, cap - len(gate.get("holders") or ())))


def _turnover(gate: CounterDoc, live: list[TicketDoc], now: datetime) -> Iterator[tuple[int, Any]]:
    """The turnover walk: yields ``(releases so far, id of the ticket picked)`` for each
    pick, in order; last ``(releases so far, None)`` when the walk's budget ends it (not
    when nothing can be picked any more).

    The walk's clock moves on with every release (the ``k``-th comes after
    ``(k − ½) · hold ÷ cap``, as the estimate says), so a ticket reaches its starvation
    promotion inside the walk as it will outside; the waiters keep their tickets alive
    meanwhile.
    """
    cap = max(1, int(gate.get("cap", 1)))
    hold = mean_hold_ms(gate) or 0.0
    held = order.Occupancy.of(gate.get("holders") or ())
    passes = order.Passes.of(gate)
    lead = order.starvation_lead(gate)
    reasking = _Reasking.of(live)
    queue = _Queue(now)
    for ticket in sorted(live, key=lambda t: (t.get("at") or now, str(t.get("id", "")))):
        queue.append(_kept_alive(ticket, now))
    owners = [parts_of(b) for b in gate.get("holders") or ()]  # (tenant, project, user) per slot, oldest first
    rankings = 0
    for step in range(MAX_WALK_STEPS + 1):
        clock = now + timedelta(milliseconds=_steps_ms(step, hold, cap))
        while len(owners) < cap:
            heads = queue.heads()
            rankings += len(heads)
            chosen = order.pick(heads, held, passes, clock, lead)
            if chosen is None:
                break
            yield step, chosen.get("id")
            queue.pop(chosen)
            held.add(*shapes.owner(chosen))
            passes.charge(chosen, queue.heads())
            owners.append(shapes.owner(chosen))
        if not owners:
            return  # nothing to release and nothing picked: blocked by its own caps
        if step == MAX_WALK_STEPS or rankings >= MAX_WALK_RANKINGS:
            break
        t, p, u = owners.pop(0)
        held.tenant[t] -= 1
        held.project[(t, p)] -= 1
        held.user[(t, u)] -= 1
        # Whoever released asks again at once, behind every ticket queued before it.
        asked = now + timedelta(milliseconds=_steps_ms(step + 1, hold, cap), microseconds=step + 1)
        queue.append(reasking.ticket(t, p, u, f"\x00again{step:06d}", asked))
    yield step, None


class _Queue:
    """The walk's queue, by kind: tickets alike in everything the order rule reads except
    their age are picked oldest first, so only the oldest of each kind is ever ranked (a
    pick costs the number of kinds, not of tickets; the same picks as over all of them).
    Tickets are appended oldest first."""

    def __init__(self, now: datetime):
        self.now = now
        self.kinds: dict[tuple, deque[TicketDoc]] = {}
        self.kind_of: dict[int, tuple] = {}  # by id() of a queued ticket: worked out once

    def append(self, ticket: TicketDoc) -> None:
        kind = self.kind_of[id(ticket)] = self._kind(ticket)
        self.kinds.setdefault(kind, deque()).append(ticket)

    def heads(self) -> list[TicketDoc]:
        """The oldest ticket of each kind."""
        return [tickets[0] for tickets in self.kinds.values()]

    def pop(self, ticket: TicketDoc) -> None:
        """Remove ``ticket``, the head of its kind."""
        kind = self.kind_of.pop(id(ticket))
        self.kinds[kind].popleft()
        if not self.kinds[kind]:
            del self.kinds[kind]

    def _kind(self, ticket: TicketDoc) -> tuple:
        caps = ticket.get("caps") or {}
        return (shapes.tenant(ticket), shapes.project(ticket), shapes.user(ticket) if "user" in caps else None,
                _rank(ticket), order.weight(shapes.tenant_weight(ticket)), order.weight(shapes.project_weight(ticket)),
                repr(sorted(caps.items())), repr(shapes.max_starvation_ms(ticket)), order.is_suspect(ticket, self.now),
                # One that sat out after finding its own level full is a kind of its own.
                ticket.get("id") if shapes.blocked_since(ticket) is not None else None)


@dataclass
class _Reasking:
    """What a holder that asks again in the walk carries: the shares and class of a queued
    ticket of its tenant and project, else of its tenant (not its project's weight), else
    the lowest class queued.

    The gate does not record a holder's class. The holder's own tickets are the best sign
    of it; without any, it is taken to pass nobody on class alone — never the top class by
    default, which would have a flood of it stand in front of every lower class for good.
    """

    by_project: dict[tuple[str, str], TicketDoc]
    by_tenant: dict[str, TicketDoc]
    lowest: int

    @classmethod
    def of(cls, live: list[TicketDoc]) -> "_Reasking":
        by_project = {(shapes.tenant(t), shapes.project(t)): t for t in live}
        by_tenant = {shapes.tenant(t): t for t in live}
        return cls(by_project, by_tenant, max((_rank(t) for t in live), default=0))

    def ticket(self, t: str, p: str, u: str, ticket_id: str, at: datetime) -> TicketDoc:
        """The re-asking holder's ticket, queued at ``at`` and kept alive."""
        like = self.by_project.get((t, p))
        fields: tuple[str, ...] = ("wt", "wp", "pc", "caps", "ms")
        if like is None:
            like, fields = self.by_tenant.get(t) or {"pc": self.lowest}, ("wt", "pc", "caps", "ms")
        # The fields are copied by name, which a TypedDict does not type: cast both ways.
        shared = cast(dict[str, Any], like)
        return cast(TicketDoc, {**{k: shared[k] for k in fields if k in shared}, "id": ticket_id, "t": t, "p": p,
                                "u": u, "at": at, "seen": at + KEPT_ALIVE, "ttl": 0})


def _rank(ticket: TicketDoc) -> int:
    """A ticket's class rank as the order rule reads it (0, the top, when it has none)."""
    return shapes.priority_rank(ticket)


# How far ahead a ticket the walk treats as kept alive was last seen: longer than any walk.
KEPT_ALIVE = timedelta(days=3650)


def _kept_alive(ticket: TicketDoc, now: datetime) -> TicketDoc:
    """The walk's copy of a queued ticket: its waiter polls meanwhile, so a fresh ticket
    stays fresh while the walk's clock moves on; one already suspect stays suspect."""
    return cast(TicketDoc, dict(ticket)) if order.is_suspect(ticket, now) else {**ticket, "seen": now + KEPT_ALIVE}


def _after_the_walk(gate: CounterDoc, tickets: list[TicketDoc], now: datetime, end: int) -> dict[str, int]:
    """Releases until each of ``tickets`` (live ones a walk did not reach in its ``end``
    releases) is picked, from its starvation bound alone: once promoted it goes before
    every class, oldest promotion first, one per release. Those without a bound, and
    suspect ones, are absent.
    """
    cap = max(1, int(gate.get("cap", 1)))
    hold = mean_hold_ms(gate) or 0.0
    lead = order.starvation_lead(gate)
    # A suspect ticket (its waiter missed a keep-alive) goes after every fresh one: unknown.
    promoted = sorted(((step, t.get("at"), str(t.get("id"))) for t in tickets if not order.is_suspect(t, now)
                       if (step := _release_promoting(t, now, hold, cap, lead)) is not None),
                      key=lambda x: (x[0], x[1] or now, x[2]))
    found: dict[str, int] = {}
    last = end
    for step, _, ticket_id in promoted:
        last = max(last + 1, step)
        found[ticket_id] = last
    return found


def _release_promoting(ticket: TicketDoc, now: datetime, hold: float, cap: int, lead: timedelta) -> int | None:
    """The first release (counted from ``now``) at which the order rule ranks ``ticket`` as
    starved; None when it never is (no bound)."""
    if not order.is_starved(ticket, now + KEPT_ALIVE, lead):
        return None
    if hold <= 0:
        return 1  # the walk's clock does not move: every release is now

    def starved(k: int) -> bool:
        return order.is_starved(ticket, now + timedelta(milliseconds=_steps_ms(k, hold, cap)), lead)

    high = 1
    while not starved(high):  # a doubling search, then halving: the rule decides, not a formula here
        high *= 2
    low = high // 2  # not starved at ``low`` (or ``low`` is 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if starved(middle) else (middle, high)
    return high


def grant_times(gate: CounterDoc, now: datetime) -> dict[str, datetime]:
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


def grant_at(gate: CounterDoc, ticket_id: str, now: datetime) -> datetime | None:
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
