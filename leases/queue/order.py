"""Who goes next: the one rule that orders the waiting tickets of a gate counter.

Functions over the gate counter's document (its booking entries, its queue and its share
accounting) and MongoDB's clock, so the rule is table-tested and lives nowhere else. The one
input not in the gate is how alive each ticket is: its process's heartbeat
(:mod:`leases.queue.presence`, read through a per-process cache), because waiters no longer
write their tickets on the gate while they wait.

The rule, in this order:

1. A ticket about to pass its ``maxStarvationMs`` (``ms``) goes before every class,
   oldest first: low classes wait a bounded time, however busy the high ones are. It is
   promoted one typical hold early (the median of the gate's recent ``holds``, at most half
   the bound): a slot frees within about one hold, so the ticket is granted by its bound,
   not a hold after it.
2. A higher priority class (``pc``, 0 = highest) goes before a lower one.
3. Within a class, the tenant with the smallest *pass* plus slots held ÷ its weight
   (``wt``) goes first — the pass is the slots it was granted here from the queue ÷ its
   weight; a tenant that comes back after a pause starts at the pass of the last grant
   (``vf``), so it banks no credit while it asks for nothing. Ties: the fewest held ÷
   weight, then the oldest ticket.
4. Within the tenant, the same rule picks the project (its weight ``wp``; passes per
   ``tenant/project``, the tenant's own floor under ``tenant/``), so a project's weight
   never moves another tenant's share; then the oldest ticket.

Passes and not only the slots held at this instant: with a small cap (2) the holdings can
only alternate, so "held ÷ weight" alone would always give equal turns; the pass is the
smooth form of the same ratio (stride scheduling). The grant that takes a slot also
charges the pass (:func:`charge`, in the same update), so no command is added per grant.

A ticket that its own tenant, project or user cap blocks is skipped, so it never holds
back tickets that could run (no head-of-line blocking). One that found such a level full
although the entries said it fits sits out briefly (``BLOCKED_PAUSE``), and the younger
tickets of its own tenant (project, user) wait behind it meanwhile: they share that level,
and arrival order within it holds as at the gate. A ticket not kept alive within
its TTL is stale: its waiter is gone and it is ignored until somebody prunes it; one not
seen for half its TTL goes after the fresh ones (its waiter is probably gone).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median
from typing import Any

from ..store import shapes
from ..store.documents import CounterDoc, TicketDoc
from ..store.entries import parts_of
from . import presence


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

    def fits(self, ticket: TicketDoc) -> bool:
        """Whether the ticket's own narrower caps leave it room."""
        caps = ticket.get("caps") or {}
        t, p, u = shapes.owner(ticket)
        return not (("tenant" in caps and self.tenant[t] >= caps["tenant"])
                    or ("project" in caps and self.project[(t, p)] >= caps["project"])
                    or ("user" in caps and self.user[(t, u)] >= caps["user"]))


@dataclass
class Passes:
    """The share accounting of a gate: pass per tenant (``t``), per project (``t/p``),
    each tenant's project floor (``t/``) and the pass of the last tenant grant (``vf``)."""

    vt: dict[str, float] = field(default_factory=dict)
    vf: float = 0.0

    @classmethod
    def of(cls, gate: CounterDoc) -> "Passes":
        return cls(shapes.tenant_passes(gate), shapes.passes_floor(gate))

    def tenant(self, t: str) -> float:
        return max(float(self.vt.get(t, 0.0)), self.vf)

    def project(self, t: str, p: str) -> float:
        return max(float(self.vt.get(f"{t}/{p}", 0.0)), float(self.vt.get(f"{t}/", 0.0)))

    def charge(self, ticket: TicketDoc, waiting: list[TicketDoc]) -> dict[str, Any]:
        """The update operators that charge one grant of ``ticket`` (picked among the live
        tickets ``waiting``, itself included); also applied here.

        ``$inc`` while the stored pass is the effective one (concurrent grants of one
        tenant then both count); ``$max`` to lift a pass that fell behind its floor. The
        floors move to the lowest pass among those still waiting: a tenant (project) that
        waits is never lifted — it keeps its due — one that comes back later starts there.
        """
        t, p = shapes.tenant(ticket), shapes.project(ticket)
        wt, wp = weight(shapes.tenant_weight(ticket)), weight(shapes.project_weight(ticket))
        ops: dict[str, dict[str, float]] = {"$inc": {}, "$max": {}}
        tenant_pass, project_pass = self.tenant(t), self.project(t, p)
        others = [x for x in waiting if x.get("id") != ticket.get("id")]
        for key, stored, effective, step in ((t, float(self.vt.get(t, 0.0)), tenant_pass, 1.0 / wt),
                                             (f"{t}/{p}", float(self.vt.get(f"{t}/{p}", 0.0)), project_pass,
                                              1.0 / wp)):
            if stored >= effective:
                ops["$inc"][f"vt.{key}"] = step
            else:
                ops["$max"][f"vt.{key}"] = effective + step
            self.vt[key] = effective + step
        if others:
            tenant_floor = min(self.tenant(shapes.tenant(x)) for x in others)
            ops["$max"]["vf"] = tenant_floor
            self.vf = max(self.vf, tenant_floor)
        mine = [x for x in others if shapes.tenant(x) == t]
        if mine:
            project_floor = min(self.project(t, shapes.project(x)) for x in mine)
            ops["$max"][f"vt.{t}/"] = project_floor
            self.vt[f"{t}/"] = max(float(self.vt.get(f"{t}/", 0.0)), project_floor)
        return {op: values for op, values in ops.items() if values}


def weight(value: Any) -> float:
    """A share weight from a ticket: positive, default 1 (a missing or broken one is 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return 1.0
    return float(value)


# A ticket that found a narrower level full although the gate's entries said it fits (a
# booking the gate cannot see, e.g. another lease name on the same resource) sits out this
# long, so it cannot hold the turn while others could run.
BLOCKED_PAUSE = timedelta(milliseconds=300)


def sits_out(ticket: TicketDoc, now: datetime) -> bool:
    """Whether a ticket recently found one of its own narrower levels full."""
    blocked_at = shapes.blocked_since(ticket)
    return (blocked_at is not None and shapes.blocked_level(ticket) in (ticket.get("caps") or {})
            and blocked_at + BLOCKED_PAUSE > now)


def _scope_at(ticket: TicketDoc, level: str) -> tuple[str, ...]:
    """Who shares ``ticket``'s counter at a narrower ``level``: its tenant, (tenant,
    project) or (tenant, user)."""
    t = shapes.tenant(ticket)
    if level == "project":
        return (t, shapes.project(ticket))
    if level == "user":
        return (t, shapes.user(ticket))
    return (t,)


def waits_behind(ticket: TicketDoc, sitting: list[TicketDoc]) -> bool:
    """Whether an older ticket of ``ticket``'s own tenant (project, user) sits out at that
    level (:func:`sits_out`): the younger one would find the same level full, and must not
    take the older one's turn meanwhile — arrival order within the tenant, project and user
    holds as it does at the gate."""
    caps = ticket.get("caps") or {}
    mine = (ticket.get("at"), ticket.get("id", ""))
    for other in sitting:
        level = str(shapes.blocked_level(other))
        if (level in caps and other.get("id") != ticket.get("id") and _scope_at(other, level) == _scope_at(ticket, level)
                and (other.get("at"), other.get("id", "")) < mine):
            return True
    return False


def last_seen(ticket: TicketDoc, now: datetime | None = None) -> datetime | None:
    """The ticket's last keep-alive (MongoDB's clock): the later of its own ``seen`` (its
    queueing, or its keeping for an HTTP client) and its process's heartbeat or its
    client's last poll (:func:`leases.queue.presence.seen_of`; ``now``, the decision's
    clock, lets a young ticket's heartbeat be read in the background)."""
    own = ticket.get("seen") or ticket.get("at")
    beat = presence.seen_of(ticket, now)
    if own is None or (beat is not None and beat > own):
        return beat
    return own


def is_suspect(ticket: TicketDoc, now: datetime) -> bool:
    """A ticket that missed its keep-alive (not seen for half its TTL): its waiter is
    probably dead. It goes after every fresh ticket, so a killed waiter picked for a free
    slot holds it idle for at most half a ticket TTL, not a whole one."""
    seen = last_seen(ticket, now)
    return seen is None or seen + timedelta(milliseconds=int(ticket.get("ttl", 0)) / 2) < now


def is_stale(ticket: TicketDoc, now: datetime) -> bool:
    """A ticket whose waiter did not keep it alive within its TTL (MongoDB's clock) — by a
    heartbeat read lately (:func:`leases.queue.presence.read_lately`): when the store is
    too slow to answer the read, or another thread's read is still under way, the ticket is
    not dropped on what was known before (its process may well have beaten since); a later
    decision drops it once a read shows it stale."""
    seen = last_seen(ticket, now)
    if seen is not None and seen + timedelta(milliseconds=int(ticket.get("ttl", 0))) >= now:
        return False
    return presence.read_lately(ticket)


def typical_hold_ms(gate: CounterDoc) -> float | None:
    """The gate's typical hold: the median of its recent ``holds`` (ms; malformed records
    left out), None when it has recorded none."""
    holds = [float(h) for h in gate.get("holds") or ()
             if isinstance(h, (int, float)) and not isinstance(h, bool) and h >= 0]
    return median(holds) if holds else None


def starvation_lead(gate: CounterDoc) -> timedelta:
    """How early a ticket is promoted before its ``maxStarvationMs``: the gate's typical
    hold (:func:`typical_hold_ms`), zero when it has recorded none."""
    return timedelta(milliseconds=typical_hold_ms(gate) or 0.0)


def is_starved(ticket: TicketDoc, now: datetime, lead: timedelta = timedelta(0)) -> bool:
    """Whether the ticket ranks as starved: it waited its definition's ``maxStarvationMs``
    minus ``lead`` (:func:`starvation_lead`; never more than half the bound), so that the
    next free slot, about one hold away, reaches it by the bound."""
    bound, at = shapes.max_starvation_ms(ticket), ticket.get("at")
    if not (isinstance(bound, int) and not isinstance(bound, bool) and at is not None):
        return False
    wait = timedelta(milliseconds=bound)
    return at + wait - min(lead, wait / 2) <= now


def _rank_key(ticket: TicketDoc, held: Occupancy, passes: Passes, now: datetime,
              lead: timedelta = timedelta(0)) -> tuple:
    t, p = shapes.tenant(ticket), shapes.project(ticket)
    if is_starved(ticket, now, lead):
        return (-1, 0.0, 0.0, 0.0, 0.0, ticket.get("at"), ticket.get("id", ""))
    wt, wp = weight(shapes.tenant_weight(ticket)), weight(shapes.project_weight(ticket))
    # Pass plus what is held now: a slot taken without queueing (nobody waited then) was
    # never charged, yet counts while it is held; a bounded addend, so the long-run shares
    # still follow the weights.
    tenant_held, project_held = held.tenant[t] / wt, held.project[(t, p)] / wp
    return (shapes.priority_rank(ticket), passes.tenant(t) + tenant_held, tenant_held,
            passes.project(t, p) + project_held, project_held, ticket.get("at"), ticket.get("id", ""))


def _order(gate: CounterDoc, now: datetime, limit: int | None) -> tuple[list[TicketDoc], list[TicketDoc]]:
    """(picked in grant order, the rest that their own caps block at every step)."""
    held = Occupancy.of(gate.get("holders") or ())
    passes = Passes.of(gate)
    lead = starvation_lead(gate)
    presence.prefetch(list(gate.get("queue") or ()), now)
    remaining = [t for t in gate.get("queue") or () if not is_stale(t, now)]
    out: list[TicketDoc] = []
    while remaining and (limit is None or len(out) < limit):
        chosen = pick(remaining, held, passes, now, lead)
        if chosen is None:
            break
        out.append(chosen)
        passes.charge(chosen, remaining)
        remaining.remove(chosen)
        held.add(*shapes.owner(chosen))
    return out, remaining


def pick(tickets: list[TicketDoc], held: Occupancy, passes: Passes, now: datetime,
         lead: timedelta = timedelta(0)) -> TicketDoc | None:
    """The one ticket of ``tickets`` (live ones) the rule grants next, given what is held,
    the passes and the starvation ``lead`` (:func:`starvation_lead` of the gate); None when
    every one is blocked by its own caps or sits out."""
    sitting = [t for t in tickets if sits_out(t, now)]
    eligible = [t for t in tickets if held.fits(t) and not sits_out(t, now)
                and not (sitting and waits_behind(t, sitting))]
    if not eligible:
        return None
    eligible = [t for t in eligible if not is_suspect(t, now)] or eligible
    behind = _behind_their_user(eligible)
    eligible = [t for t in eligible if t.get("id") not in behind or is_starved(t, now, lead)]
    return min(eligible, key=lambda t: _rank_key(t, held, passes, now, lead))


def _behind_their_user(eligible: list[TicketDoc]) -> set[str]:
    """The ids of tickets an older ticket of the same capped user (tenant-wide), of the
    same class or a higher one, could take the slot ahead of: arrival order within a user
    holds across its projects. The project shares alone would give the user's slot to
    whichever of its projects is due, and a user waiting in a project that is rarely due
    when its slot is free would be passed over by its own younger tickets for as long as
    that lasts. The oldest ticket of each user is never among them, so the list never
    empties; the caller keeps a starved ticket all the same."""
    by_user: dict[tuple[str, ...], list[TicketDoc]] = {}
    for ticket in eligible:
        if "user" in (ticket.get("caps") or {}):
            by_user.setdefault(_scope_at(ticket, "user"), []).append(ticket)
    behind: set[str] = set()
    for tickets in by_user.values():
        best: int | None = None  # the highest class (lowest rank) among the older ones so far
        for ticket in sorted(tickets, key=lambda t: (t.get("at"), t.get("id", ""))):
            rank = shapes.priority_rank(ticket)
            if best is not None and best <= rank:
                behind.add(str(ticket.get("id")))
            best = rank if best is None else min(best, rank)
    return behind


def ranked(gate: CounterDoc, now: datetime, limit: int | None = None) -> list[TicketDoc]:
    """The live tickets in the order they would be granted if slots kept freeing.

    Each pick counts as held and is charged to its tenant's pass for the picks after it,
    so tenants take turns by weight. Tickets that their own caps block at every step come
    last, oldest first. ``limit`` stops early.
    """
    out, remaining = _order(gate, now, limit)
    if limit is None or len(out) < limit:
        out.extend(sorted(remaining, key=lambda t: (t.get("at"), t.get("id", "")))[
            : None if limit is None else limit - len(out)])
    return out


def next_grants(gate: CounterDoc, now: datetime) -> list[str]:
    """The tickets that may take the gate's free slots now (ids, best first).

    Only tickets that fit their own caps count, so a blocked ticket never takes a turn.
    """
    free = int(gate.get("cap", 0)) - len(gate.get("holders") or ())
    if free <= 0:
        return []
    picked, _ = _order(gate, now, free)
    return [t["id"] for t in picked]


def charge(gate: CounterDoc | None, ticket_id: str) -> dict[str, Any]:
    """The update operators that charge a grant of ``ticket_id`` to its tenant's and
    project's pass, computed from the gate as the grantee last saw it ({} when it is not
    queued there). Merged into the booking update of the gate, so it costs no command."""
    if not gate:
        return {}
    queue = list(gate.get("queue") or ())
    mine = next((t for t in queue if t.get("id") == ticket_id), None)
    if mine is None:
        return {}
    now = gate.get("clock")
    live = [t for t in queue if now is None or not is_stale(t, now)]
    return Passes.of(gate).charge(mine, live)


def position(gate: CounterDoc, ticket_id: str, now: datetime) -> int | None:
    """1-based place of ``ticket_id`` in the grant order; None when it is not queued (live)."""
    for index, ticket in enumerate(ranked(gate, now), start=1):
        if ticket.get("id") == ticket_id:
            return index
    return None


def blocking_level(gate: CounterDoc, ticket: TicketDoc, now: datetime) -> str:
    """The level that holds ``ticket`` back now: its narrowest own cap that the gate's
    entries show full, else the narrower level it last found full (while it sits out), else
    the gate's own level (its turn has not come)."""
    held = Occupancy.of(gate.get("holders") or ())
    caps = ticket.get("caps") or {}
    t, p, u = shapes.owner(ticket)
    for level, count in (("user", held.user[(t, u)]), ("project", held.project[(t, p)]),
                         ("tenant", held.tenant[t])):
        if level in caps and count >= caps[level]:
            return level
    if sits_out(ticket, now):
        return str(shapes.blocked_level(ticket))
    return str(gate.get("level") or "global")


def stale_ids(gate: CounterDoc, now: datetime) -> list[str]:
    """Ids of the tickets nobody keeps alive any more."""
    presence.prefetch(list(gate.get("queue") or ()), now)
    return [t["id"] for t in gate.get("queue") or () if is_stale(t, now)]
