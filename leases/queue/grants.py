"""Direct hand-off: whoever frees a gate slot grants it to the ticket the order rule picks.

In one update (:func:`hand_back`): a process that saw tickets waiting reads the gate with
MongoDB's clock, runs the order rule (:mod:`leases.queue.order`) on it as if its own entry
were gone, and swaps its entry for the pick's in one update conditional on the gate as read
(:func:`leases.store.ticket_commands.swap`). Otherwise, or when that update matches nothing,
the plain way (:func:`hand_over`): a release (or a reap, a revoke, a repair) returns its gate
slot with one command that answers the gate as it is now, the order rule picks the next
ticket on that document, and the freeing process books the slot *for* it with one more
update of the gate (:func:`leases.store.ticket_commands.grant`): the ticket's entry pushed,
the ticket dequeued, its pass charged and its fence recorded, all conditional on the ticket
still being queued and the gate below its cap. The waiter learns it from its wake-up (the
message carries the entry, the fence and the grant's time on MongoDB's clock) or, if that is
lost, from the gate on its next keep-alive; it books nothing and only marks its holder
``HELD`` (one command) — a blocking ``leases.acquire`` told by the wake-up returns at once
and sends that mark from a background thread (:mod:`leases.engine.claims`). Nobody can take
the slot in between, so the cap never idles for a wake-up and a booking round trip.

What is granted directly: tickets whose holder's ``attemptId`` the ticket carries (the
entry must name it), which look alive (kept alive within half their TTL), and whose
narrower levels, if any, the ticket describes (``lv``: their keys and caps as its waiter's
view had them; a ticket fenced on a narrower level carries none). A ticket with narrower
levels is granted by one ordered bulk that books the gate first and then those levels
(:func:`_grant_levels`); a release that saw the queue puts its own narrower returns, the
gate swap and those bookings in one ordered bulk (:func:`_in_one_bulk`). Every other pick is
woken and books itself, as before.

A grant nobody claims (its waiter died after it was picked, or stalls) gives the slot back
once :func:`claim_ms` has passed: the grant records its time on the gate (``claims``, no
extra command; the pull of the entry removes it), and the next repair of the full gate —
run by any waiter that finds it full — ends a granted holder still ``PENDING`` after that
(a ``PENDING`` holder runs no handler) and hands the slot on. An HTTP ticket (no waker)
gets no claim: its poll deadline is its window, and its next poll claims it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pymongo.errors
from pymongo import ReturnDocument, UpdateOne

from ..conf import lease_settings
from ..definitions import caps
from ..definitions.model import LevelSpec
from ..store import client as store, counter_commands, entries, holder_commands, shapes, ticket_commands
from ..store.documents import CounterDoc, TicketDoc
from . import fences, order, presence, slots, wakeups

log = logging.getLogger(__name__)


def claim_ms() -> int:
    """How long a granted waiter has to mark its holder ``HELD`` before the slot moves on."""
    return int(lease_settings.GRANT_CLAIM_MS)


def grantable(ticket: TicketDoc, now: datetime) -> bool:
    """Whether the freeing process books the slot for ``ticket`` (else it only wakes it)."""
    caps = shapes.narrow_caps(ticket)
    return ((not caps or len(narrow_specs(ticket)) == len(caps)) and shapes.attempt(ticket) is not None
            and not order.is_suspect(ticket, now))


def narrow_specs(ticket: TicketDoc) -> list[LevelSpec]:
    """The ticket's narrower levels as its waiter's view had them (``lv``, narrow first,
    with the view's lease and load time for the cap stamps); empty when it carries none."""
    out: list[LevelSpec] = []
    for level in ticket.get("lv") or ():
        if not isinstance(level, dict) or not isinstance(level.get("k"), str) or not isinstance(level.get("c"), int):
            return []
        out.append(LevelSpec(level=str(level.get("l")), scope=str(level.get("s")), cap=int(level["c"]),
                             key=level["k"], tenant_id=shapes.tenant(ticket), lease=str(ticket.get("ln") or ""),
                             loaded_at=ticket.get("la")))
    return out


def booking_of(ticket: TicketDoc) -> str:
    """The entry the ticket's holder books (its owner, its ``attemptId``, its token)."""
    t, p, u = shapes.owner(ticket)
    return entries.entry(t, p, u, ticket["id"], shapes.attempt(ticket))


def plan_for(gate: CounterDoc, ticket_id: str, slot: int, booking: str) -> fences.Plan:
    """The fence the grant issues on the gate: ``slot`` (the ticket's turn), one generation
    above the slot's as the document shows it, never below the server clock's floor."""
    slots: Any = gate.get(fences.FIELD) or {}
    recorded = slots.get(fences.slot_field(slot)) if isinstance(slots, dict) else None
    generation = recorded.get("g") if isinstance(recorded, dict) else None
    seen = generation if isinstance(generation, int) else 0
    return fences.Plan(gate["_id"], slot, max(seen + 1, fences.floor_of(gate.get("clock"))), booking)


def hand_over(gate: CounterDoc, picked: Sequence[str]) -> tuple[list[str], CounterDoc]:
    """Grant the gate's free slots to the tickets of ``picked`` (the order rule's picks on
    ``gate``, best first) that are :func:`grantable`, each with one update, and tell their
    waiters. Never raises: a pick whose grant fails (taken meanwhile, its ticket gone, the
    store failing) is left to be woken.

    Returns:
        The picks not granted here (the caller wakes them), and the gate after the last grant.
    """
    now = gate.get("clock")
    if now is None or not picked:
        return list(picked), gate
    by_id = {t["id"]: t for t in shapes.queue_of(gate)}
    turns = fences.turns(gate, picked)
    cap = int(gate.get("cap") or 0)
    left: list[str] = []
    latest = gate
    for ticket_id in picked:
        ticket = by_id.get(ticket_id)
        if ticket is None or ticket_id not in turns or not grantable(ticket, now):
            left.append(ticket_id)
            continue
        booking = booking_of(ticket)
        plan = plan_for(gate, ticket_id, turns[ticket_id], booking)
        grant = ticket_commands.grant(gate["_id"], ticket_id, booking, cap=cap, clauses=[plan.clause()],
                                      charge=order.charge(gate, ticket_id), record=plan.update(),
                                      claimed_by=ticket_id if shapes.waker(ticket) else None)
        at = None  # the grant's time on MongoDB's clock, when its command answers it
        try:
            narrow = narrow_specs(ticket)
            if narrow:
                granted = _grant_levels(gate, ticket, booking, grant, narrow, plan.fence)
                at = now  # the bulk answers no document: the TTL runs from the read just before
            else:
                after = store.counters().find_one_and_update(*grant, return_document=ReturnDocument.AFTER)
                granted = after is not None
                if after is not None:
                    latest, at = after, after.get("clock")
                    fences.note(after)
        except pymongo.errors.PyMongoError as exc:
            log.info("grant of %s on %s failed (%s); it is woken instead", ticket_id, gate["_id"], exc)
            granted = False
        if not granted:
            left.append(ticket_id)  # taken, gone, raced or a narrower level full: its waiter decides itself
            continue
        _tell(ticket, booking, plan.fence, at)
    return left, latest


# A swap that raced (another hand-off changed the gate between the read and the update) reads
# and swaps again this many times in all before the plain way: the read and the swap are
# commands by ``_id``, the plain way's two ``findAndModify`` cost several times more on the
# embedded server, and under short holds two slots' hand-offs collide often.
SWAP_TRIES = 3
_RACED: Any = object()  # what one try answers when its swap matched nothing


#: What :func:`hand_back` answers when it granted the slot and then undid the grant (a
#: narrower level of the ticket was full): the releaser's gate entry is gone, the slot is
#: free and the ticket queued again, so the caller hands the free slot off from a fresh read.
UNDONE: Any = object()


def hand_back(gate_key: str, booking: str, more: dict[str, Any] | None = None,
              narrow: Sequence[str] = ()) -> Any:
    """Return the gate slot of ``booking`` (and its ``narrow`` levels) and grant it to the next
    ticket in one command (read and swap again, up to :data:`SWAP_TRIES` in all, when another
    hand-off raced it).

    Returns, raises: as :func:`_hand_back_once` (never ``_RACED``).
    """
    for _ in range(SWAP_TRIES):
        done = _hand_back_once(gate_key, booking, more, narrow)
        if done is not _RACED:
            return done
    return None


def _hand_back_once(gate_key: str, booking: str, more: dict[str, Any] | None = None,
                    narrow: Sequence[str] = ()) -> Any:
    """One read and one swap: return the gate slot of ``booking`` and grant it to the next
    ticket in one update — or, when the releaser has narrower levels (``narrow``, their
    keys) or the ticket has, in one ordered bulk (:func:`_in_one_bulk`).

    One read of the gate (with MongoDB's clock) shows who is next once this slot is free;
    when that is exactly one ticket the freeing process may grant (:func:`grantable`, with
    no narrower levels to book), one update swaps the entries
    (:func:`leases.store.ticket_commands.swap`) — only on the entries as read, so anything
    booked, returned or granted in between makes it match nothing — and the waiter is told.
    That is the whole critical path of a hand-off on the releaser's side: a read and one
    write, both by ``_id``, instead of a return and a grant that each answer the document.
    ``more``: the release's own update operators.

    Returns:
        The gate as the swap left it (built from the read: no command answers it), or None
        when nothing was done — nobody to grant, several to grant, a ticket that books
        itself, the entry not on the gate — and the caller returns the slot the plain way
        (:func:`leases.queue.slots.give_back` and the hand-off on what it answers), or
        ``_RACED`` when the swap matched nothing (nothing was done on the gate either), or
        :data:`UNDONE`.

    Raises:
        pymongo.errors.PyMongoError: the store failed; nothing or everything was done (one
            update), and the caller's plain return finds out which (it pulls by value).
    """
    # With the heartbeats the order rule will look up: no presence read on the hand-off's path.
    read: Any = presence.read_gate(gate_key)
    holders = (read or {}).get("holders")
    now = (read or {}).get("clock")
    if read is None or now is None or not isinstance(holders, list) or booking not in holders:
        return None
    cap = int(read.get("cap") or 0)
    if int(read.get("count") or 0) != len(holders) or len(holders) > cap:
        return None  # a counter repair must look at first: the plain way
    freed: CounterDoc = {**read, "holders": [h for h in holders if h != booking],
                         "count": len(holders) - 1}
    picked = order.next_grants(freed, now)
    if len(picked) != 1:
        return None  # nobody to grant, or several free slots: the plain hand-off grants them all
    ticket = next((t for t in shapes.queue_of(freed) if t["id"] == picked[0]), None)
    if ticket is None or not grantable(ticket, now):
        return None
    levels = narrow_specs(ticket) if shapes.narrow_caps(ticket) else []
    ticket_id = ticket["id"]
    if ticket_id == entries.token_of(booking):
        # A waiter giving back a grant to an earlier writing of its holder, its ticket queued
        # again: one update cannot end the token's claim window and open it again (MongoDB
        # refuses the conflicting paths); the plain way returns, then grants.
        return None
    turn = fences.turns(freed, picked).get(ticket_id)
    if turn is None:
        return None
    entry = booking_of(ticket)
    plan = plan_for(freed, ticket_id, turn, entry)
    recorded: Any = (read.get(fences.FIELD) or {}).get(fences.slot_field(turn))
    seen = {k: recorded[k] for k in ("e", "g") if k in recorded} if isinstance(recorded, dict) else None
    command = ticket_commands.swap(
        gate_key, released=booking, holders=holders, booking=entry, ticket_id=ticket_id, cap=cap,
        slot_field=f"{fences.FIELD}.{fences.slot_field(turn)}", slot_seen=seen,
        charge=order.charge(freed, ticket_id), record=plan.update(), more=more,
        claimed_by=ticket_id if shapes.waker(ticket) else None)
    if narrow or levels:
        # One ordered bulk: the releaser's narrower entries first (a ticket of the same user
        # or project may need the very slot), then the swap and the ticket's narrower levels.
        swapped = _in_one_bulk(read, ticket, entry, command, levels, plan.fence,
                               before=counter_commands.pull_ops(narrow, booking))
        if swapped is not True:
            return swapped
    elif not store.counters().update_one(*command).matched_count:
        return _RACED
    after: Any = {**freed, "holders": [*freed["holders"], entry], "count": len(holders),
                  "queue": [t for t in shapes.queue_of(freed) if t["id"] != ticket_id],
                  fences.FIELD: {**(read.get(fences.FIELD) or {}), fences.slot_field(turn): {"e": entry, "g": plan.generation}}}
    fences.note(after)
    _tell(ticket, entry, plan.fence, now)
    return after


def _grant_levels(gate: CounterDoc, ticket: TicketDoc, booking: str, grant: tuple[dict[str, Any], dict[str, Any]],
                  narrow: list[LevelSpec], fence: str) -> bool:
    """Grant a ticket with narrower levels in one ordered bulk (:func:`_in_one_bulk`); its
    waiter books itself when woken if that fails.

    Returns:
        Whether every level is booked for the ticket.

    Raises:
        pymongo.errors.PyMongoError: the store failed (repair returns what a partial grant left:
            the ticket's holder is PENDING with entries booked, which it pulls once past its TTL).
    """
    return _in_one_bulk(gate, ticket, booking, grant, narrow, fence) is True


def _in_one_bulk(gate: CounterDoc, ticket: TicketDoc, booking: str, grant: tuple[dict[str, Any], dict[str, Any]],
                 narrow: list[LevelSpec], fence: str, *, before: Sequence[UpdateOne] = ()) -> Any:
    """One ordered bulk: ``before`` (a releaser's own returns), then the gate's ``grant`` (or
    swap) — which dequeues the ticket, so of all who might grant it (or its own waiter) one
    alone goes on — then each narrower level (conditional pushes, as a booking's). The gate's
    update and the pushes go as upserts: one that does not match collides on ``_id``, which
    stops the bulk there, so nothing is booked for the ticket after a gate update that
    matched nothing. If a narrower level is full after all (a newcomer booked it on its way
    to the queue), what was booked is pulled back by value and the ticket is queued again as
    it was (its arrival kept) in one more bulk.

    When the bulk's outcome is unknown (its answer was lost: it may have landed whole), the
    ticket's waiter may have seen the grant whole and claimed it (``fence``: the fence it
    issued) before the undo: the undo first records on the ticket's ``PENDING`` holder that
    this grant is undone (:func:`leases.store.holder_commands.grant_undone`), so that a claim
    after it marks nothing — and if the holder is ``HELD`` already, the grant stands.

    Returns:
        True when every level is booked for the ticket; ``_RACED`` when the gate's update
        matched nothing (nothing booked for the ticket; ``before`` may have landed);
        :data:`UNDONE` when it was booked, then pulled back and requeued.

    Raises:
        pymongo.errors.PyMongoError: the store failed, and so did the undo.
    """
    resource = str(gate.get("resource") or "")
    ops = [*before, UpdateOne(*grant, upsert=True)]
    at_gate = len(before)
    for spec in narrow:
        seeded = counter_commands.seed(resource=resource, level=spec.level, scope=spec.scope,
                                       tenant_id=spec.tenant_id, cap=spec.cap, lease=caps.born(spec, resource))
        clauses = [c for c in (caps.obeyed(spec),) if c]
        ops.append(UpdateOne(*counter_commands.take_slot(spec.key, booking, cap=spec.cap, seeded=seeded,
                                                         clauses=clauses), upsert=True))
    narrow_from = at_gate + 1  # the index of the first narrower level's push in ``ops``
    try:
        done = store.counters().bulk_write(ops, ordered=True)
        slots.settle_created(narrow, resource, done.upserted_ids, offset=narrow_from)
        return True
    except pymongo.errors.BulkWriteError as exc:
        slots.settle_created(narrow, resource, exc.details.get("upserted"), offset=narrow_from)
        errors = exc.details.get("writeErrors") or []
        # The bulk stops at its first error, whatever it is; without one (a write concern
        # error) every op may have landed: undo them all.
        stopped = int(errors[0]["index"]) if errors else len(ops)
    except pymongo.errors.PyMongoError:
        stopped = len(ops)  # unknown how far it went: undo all (pulls by value, enqueue if missing)
    if stopped <= at_gate:
        return _RACED
    if stopped == len(ops) and _claimed_meanwhile(ticket, fence):
        return True  # applied whole and claimed: pulling it back now would strip a held lease
    keys = [gate["_id"], *(spec.key for spec in narrow[:stopped - at_gate - 1])]
    undo(gate["_id"], keys, booking, ticket, fences.recorded_slot(grant[1]))
    return UNDONE


def undo(gate_key: str, keys: Sequence[str], booking: str, ticket: TicketDoc, fence_slot: str | None) -> None:
    """Undo a grant of ``ticket`` in one ordered bulk: its entry ``booking`` pulled by value
    from each narrower counter of ``keys``, then from the gate with the ticket queued again
    as it was (its arrival kept) in the same update (:func:`leases.store.ticket_commands.requeue`).
    The gate's fence slot the grant recorded (``fence_slot``) is freed with that pull: the
    ticket queues again with the same entry, which a later grant may record on another slot.

    Only while the gate still books the entry is the ticket queued again: an entry somebody
    else gave back first (the waiter whose claim found the grant undone, the release of a
    lease claimed before the undo) left the slot naming it, and its ticket names a holder
    that is gone or written again. Pulls by value: a second undo changes nothing.

    Raises:
        pymongo.errors.PyMongoError: the store failed (what is left booked for the
            ``PENDING`` holder is repair's).
    """
    ops = [UpdateOne(*counter_commands.pull(key, booking)) for key in keys if key != gate_key]
    ops.append(UpdateOne(*ticket_commands.requeue(gate_key, booking, dict(ticket), fence_slot=fence_slot)))
    store.counters().bulk_write(ops, ordered=True)


def _claimed_meanwhile(ticket: TicketDoc, fence: str) -> bool:
    """Before undoing a grant whose bulk may have landed whole: whether its waiter claimed it
    already (the holder is ``HELD``: it saw every level booked), else make sure it never
    will (:func:`leases.store.holder_commands.grant_undone`). One command, two when the
    holder is not ``PENDING``; only on this rare path.

    Raises:
        pymongo.errors.PyMongoError: the store failed (nothing is undone: the grant stays
            for its waiter to claim, or for repair once the claim window passed).
    """
    attempt = shapes.attempt(ticket)
    if store.holders().update_one(*holder_commands.grant_undone(ticket["id"], attempt, fence)).matched_count:
        return False
    holder = store.holders().find_one({"_id": ticket["id"], "attemptId": attempt}, {"state": 1})
    return holder is not None and holder.get("state") == "HELD"


def complete(keys: Sequence[str], booking: str) -> bool:
    """Whether every counter of ``keys`` (the narrower levels) books ``booking``: a grant
    seen on the gate alone may still be under way, or being undone (:func:`_grant_levels`
    books the gate first), so a waiter that learns of its grant from the gate, not from the
    wake-up, claims only when this holds. One read.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    if not keys:
        return True
    return store.counters().count_documents({"_id": {"$in": list(keys)}, "holders": booking}) == len(set(keys))


def _tell(ticket: TicketDoc, booking: str, fence: str, at: datetime | None) -> None:
    """Wake the granted ticket's waiter with its entry, its fence and the grant's time on
    MongoDB's clock (an HTTP ticket has no waker: every process hears of it, for a poll that
    waits for it; else its next poll claims it). Never raises."""
    wakeups.grant(ticket["id"], shapes.waker(ticket), booking, fence, at)


def unclaimed(counter: CounterDoc, now: datetime) -> dict[str, datetime]:
    """The tokens granted a slot on ``counter`` more than :func:`claim_ms` before ``now``
    (MongoDB's clock) and not released since, with the grant's time: repair ends those
    whose holder is still ``PENDING`` (their waiter never claimed)."""
    claims = counter.get("claims")
    limit = now - timedelta(milliseconds=claim_ms())
    return {t: at for t, at in (claims.items() if isinstance(claims, dict) else ())
            if isinstance(at, datetime) and at < limit}


def claim_bound_ms() -> int:
    """The longest a granted waiter whose process lives has to claim: the claim window plus
    the ticket TTL."""
    return claim_ms() + int(lease_settings.TICKET_TTL_MS)


def may_still_claim(granted_at: datetime, holder: dict[str, Any], now: datetime) -> bool:
    """Whether repair leaves a grant past its claim window to its waiter for now: its holder
    names the process waiting on it (``w``) and that process's heartbeat looks alive (no
    heartbeat missed for half the ticket TTL), and :func:`claim_bound_ms` has not passed.

    The claim window alone would end grants to waiters that are merely slow — a process
    whose threads wait for the CPU, a store queueing commands under load — and each such end
    costs the waiter its turn and the store a queueing again: under load the losses add load.
    A process that died is told by its heartbeat within half the ticket TTL; a holder without
    ``w`` (written by an older version) ends at the claim window, as before."""
    waker = holder.get("w")
    if not isinstance(waker, str) or not waker:
        return False
    if granted_at < now - timedelta(milliseconds=claim_bound_ms()):
        return False
    return not order.is_suspect({"w": waker, "ttl": int(lease_settings.TICKET_TTL_MS)}, now)


def granted_entry(gate: CounterDoc | None, token: str) -> str | None:
    """The entry the gate books for ``token`` (a grant whose wake-up was lost), or None."""
    for value in (gate or {}).get("holders") or ():
        if entries.token_of(value) == token:
            return str(value)
    return None


@dataclass(frozen=True)
class Grant:
    """A grant a counter shows for a token: its entry, its fence, and whether every narrower
    level books the entry too (else the grant's bulk is under way or being undone)."""

    booking: str
    fence: str | None
    complete: bool


def grant_on(gate: CounterDoc | None, token: str, narrow_keys: Sequence[str]) -> Grant | None:
    """The grant ``gate`` shows for ``token`` (its wake-up lost or not read yet), or None; a
    waiter claims it only when it is :attr:`Grant.complete` (one read with narrower levels).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    booking = granted_entry(gate, token)
    if booking is None:
        return None
    return Grant(booking, fence_of(gate, booking), complete(narrow_keys, booking))


def fence_of(counter: CounterDoc | None, booking: str) -> str | None:
    """The fence recorded for ``booking`` on ``counter`` (its slot and generation), or None."""
    recorded = (counter or {}).get(fences.FIELD)
    for name, value in (recorded.items() if isinstance(recorded, dict) else ()):
        if isinstance(value, dict) and value.get("e") == booking and name[1:].isdigit() and isinstance(
                value.get("g"), int):
            return fences.Plan(str(counter["_id"]), int(name[1:]), value["g"], booking).fence  # type: ignore[index]
    return None
