"""Fences: each grant gets a fence in the very update that books its slot.

A lease's *fence counter* is its gate (the widest capped level, the resource's ceiling)
unless its definition names another capped level (``fence: user``). That counter keeps,
per slot ``0 <= s < cap``, who was granted the slot last and with which generation::

    fence: {"s0": {"e": <booking entry>, "g": <generation>}, "s1": {...}, ...}

A slot is free when its recorded entry is no longer among the counter's ``holders``: every
path that ends a booking (release, reap, revoke, repair, reconcile, rollback) pulls the
entry, so none of them has to know about slots, and none of them touches ``fence``.

The booking update cannot answer what it chose (an ordered bulk answers counts), so the
attempt *proposes* the slot and the generation and the booking's filter checks them in
the same atomic update: the slot is free and its recorded generation is lower than the
proposal. A wrong proposal (another process took the slot, or a newer generation landed)
fails that level like a full one: the funnel reads the counter, which it does on that path
anyway, and proposes again from what it read. Proposals come from the counter documents
this process has seen (every command that returns a counter feeds :func:`note`).

Why a generation is never issued twice for a (counter, slot):

* While the counter exists, the filter ``recorded < proposed`` makes the slot's generations
  strictly increase, whoever books it, whatever ended the last booking.
* Nothing rewrites ``fence``: repair and reconcile pull entries or set ``holders``/``count``,
  cap stamps set ``cap``; and reconcile never deletes a counter that has a ``fence`` (it
  deletes idle counters without one, as before).
* A proposal is never below ``server time in ms x 1000`` (the clock of the latest command
  that answered this attempt), so a counter deleted by hand, or a store restored or wiped
  by a server restart, starts its slots above every generation issued before, unless
  MongoDB's clock went back by more than the time since (a slot would need a thousand
  grants within one millisecond to run ahead of the clock).
"""

from __future__ import annotations

import calendar
import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..definitions.model import LeaseDefinition, LevelSpec
from ..store import counter_commands, fence_codec
from ..store.documents import CounterDoc

FIELD = "fence"
# Generations per millisecond of the floor: a slot cannot be granted this often in one.
PER_MS = 1000
# A proposal without a view of the counter picks among this many slots at most.
BLIND_SLOTS = 64
VIEW_LIMIT = 4096
# How often one booking proposes again from a fresh read that shows room (racing bookings
# took its slots) before the funnel treats the level as it treats a race for a full one.
PROPOSALS = 3


def slot_field(slot: int) -> str:
    """The key of ``slot`` inside a counter's ``fence``."""
    return f"s{slot}"


def spec_of(definition: LeaseDefinition, specs: Sequence[LevelSpec]) -> LevelSpec:
    """The fence counter's level among an attempt's ``specs``: the definition's ``fence``
    level, else the gate (the widest capped level, the last spec)."""
    level = definition.fence_level
    return next((s for s in specs if s.level == level), specs[-1]) if level else specs[-1]


def floor_of(*times: datetime | None) -> int:
    """The least generation a proposal may carry: the latest of ``times`` (MongoDB's
    clock, as commands answered it) in ms, times :data:`PER_MS`; 1 without any."""
    known = [t for t in times if t is not None]
    if not known:
        return 1
    latest = max(known)
    ms = calendar.timegm(latest.utctimetuple()) * 1000 + latest.microsecond // 1000
    return max(1, ms * PER_MS)


@dataclass
class _View:
    holders: frozenset[str]
    slots: dict[int, tuple[str, int]] = field(default_factory=dict)  # slot -> (entry, generation)
    clock: datetime | None = None


_views: OrderedDict[str, _View] = OrderedDict()
_turns: OrderedDict[tuple[str, str], int] = OrderedDict()  # (counter key, ticket) -> its slot
_lock = threading.Lock()


def note(doc: CounterDoc | dict[str, Any] | None) -> None:
    """Remember a counter document a command returned (its bookings and its slots), for
    the next proposal on it. Never raises on a document of another shape."""
    if not doc or not isinstance(doc.get("_id"), str) or not isinstance(doc.get("holders"), list):
        return
    slots: dict[int, tuple[str, int]] = {}
    recorded = doc.get(FIELD)
    for name, value in (recorded.items() if isinstance(recorded, dict) else ()):
        if isinstance(name, str) and name[1:].isdigit() and isinstance(value, dict):
            generation = value.get("g")
            slots[int(name[1:])] = (str(value.get("e")), generation if isinstance(generation, int) else 0)
    clock = doc.get("clock") or doc.get("updatedAt")
    view = _View(frozenset(doc["holders"]), slots, clock if isinstance(clock, datetime) else None)
    with _lock:
        _views[doc["_id"]] = view
        _views.move_to_end(doc["_id"])
        while len(_views) > VIEW_LIMIT:
            _views.popitem(last=False)


def turns(doc: CounterDoc | None, picked: Sequence[str]) -> dict[str, int]:
    """The slot each ticket of ``picked`` (the order rule's picks, best first) proposes when it
    books: the i-th free slot of the counter, lowest first. Every process that reads the same
    document assigns the same, so waiters picked together propose distinct slots."""
    if not doc or not picked or not isinstance(doc.get("holders"), list):
        return {}
    recorded = doc.get("fence")
    booked = set(doc["holders"])
    occupied = {int(name[1:]) for name, value in (recorded.items() if isinstance(recorded, dict) else ())
                if name[1:].isdigit() and isinstance(value, dict) and value.get("e") in booked}
    free: list[int] = []
    slot, cap = 0, int(doc.get("cap") or 0)
    while len(free) < len(picked) and slot < cap:
        if slot not in occupied:
            free.append(slot)
        slot += 1
    return dict(zip(picked, free))


def expect(key: str, assigned: dict[str, int]) -> None:
    """Remember the slots the tickets of this process were assigned on counter ``key``
    (:func:`turns`); the next proposal of each proposes its own."""
    with _lock:
        for ticket, slot in assigned.items():
            _turns[(key, ticket)] = slot
            _turns.move_to_end((key, ticket))
        while len(_turns) > VIEW_LIMIT:
            _turns.popitem(last=False)


def hint_of(doc: CounterDoc | None, picked: Sequence[str] = ()) -> dict[str, Any] | None:
    """What a waker publishes with a wake-up (:func:`leases.wakeups.wake`): the counter's free
    slots and their generations, and the turns of ``picked``, from the document its own update
    returned; None without."""
    recorded = (doc or {}).get("fence")
    if not doc or not isinstance(doc.get("holders"), list) or not isinstance(recorded, dict):
        return None
    booked = set(doc["holders"])
    free = {name: value.get("g") for name, value in recorded.items()
            if isinstance(value, dict) and value.get("e") not in booked}
    assigned = turns(doc, picked)
    return {"fence": {"k": doc["_id"], "free": free, "turns": assigned}} if free or assigned else None


def note_hint(hint: dict[str, Any]) -> None:
    """Take a wake-up's hint into this process's view: the slots it names are free now, with
    those generations. A stale hint only costs a refused proposal. Never raises."""
    body = hint.get("fence")
    if not isinstance(body, dict) or not isinstance(body.get("k"), str) or not isinstance(body.get("free"), dict):
        return
    assigned = body.get("turns")
    if isinstance(assigned, dict):
        expect(body["k"], {t: s for t, s in assigned.items() if isinstance(t, str) and isinstance(s, int)})
    with _lock:
        view = _views.get(body["k"])
        if view is None:
            return  # no view to correct: the blind proposal is as good
        for name, generation in body["free"].items():
            if isinstance(name, str) and name[1:].isdigit() and isinstance(generation, int):
                view.slots[int(name[1:])] = ("", generation)  # "" is never a booked entry


def forget() -> None:
    """Drop every remembered view and turn (tests; a process that must start blind)."""
    with _lock:
        _views.clear()
        _turns.clear()


@dataclass(frozen=True)
class Plan:
    """The fence an attempt proposes on counter ``key``: ``slot`` with ``generation``, for
    its booking ``entry``."""

    key: str
    slot: int
    generation: int
    entry: str

    @property
    def fence(self) -> str:
        """The fence string the holder gets when the booking lands."""
        return fence_codec.encode(self.key, self.slot, self.generation)

    def clause(self) -> dict[str, Any]:
        """The booking filter's part: the slot is free (its last entry is no longer booked)
        and its recorded generation is below the proposal."""
        return counter_commands.fence_clause(f"${FIELD}.{slot_field(self.slot)}", self.generation)

    def update(self) -> dict[str, Any]:
        """The booking update's part: record the slot's new holder and generation."""
        return counter_commands.fence_record(f"{FIELD}.{slot_field(self.slot)}", self.entry, self.generation)

    def slot_on(self) -> tuple[str, str]:
        """(counter key, the slot's field) — what a give-back of this booking clears."""
        return self.key, f"{FIELD}.{slot_field(self.slot)}"


def recorded_slot(update: dict[str, Any]) -> str | None:
    """The fence slot (``fence.sN``) a booking ``update`` records (:meth:`Plan.update` in its
    ``$set``), or None."""
    for name in (update.get("$set") or {}):
        if isinstance(name, str) and name.startswith(f"{FIELD}.") and name[len(FIELD) + 2:].isdigit():
            return name
    return None


def slot_naming(counter: CounterDoc | None, entry: str) -> str | None:
    """The fence slot (``fence.sN``) ``counter`` records for ``entry``, or None."""
    recorded: Any = (counter or {}).get(FIELD)
    for name, value in (recorded.items() if isinstance(recorded, dict) else ()):
        if isinstance(value, dict) and value.get("e") == entry:
            return f"{FIELD}.{name}"
    return None


def plan(spec: LevelSpec, entry: str, *, floor: int, counter: CounterDoc | None = None,
         rng: random.Random | None = None) -> Plan:
    """Propose a slot and generation for ``entry`` on ``spec``'s counter, from ``counter``
    (a document just read) or else this process's latest view of it.

    A waiting ticket whose turn came proposes the slot its turn assigned (:func:`turns`).
    Else a free slot below the cap, at random among the free ones the view shows (processes
    proposing at once then rarely collide); without a view, one of the first
    :data:`BLIND_SLOTS`. The generation: one above the slot's as seen, at least ``floor``.
    """
    note(counter)
    choose = rng or random
    with _lock:
        view = _views.get(spec.key)
        turn = _turns.pop((spec.key, entry.rsplit("/", 1)[-1]), None)
    if turn is not None and turn < spec.cap:
        seen = view.slots.get(turn, ("", 0))[1] if view is not None else 0
        return Plan(spec.key, turn, max(seen + 1, floor, floor_of(view.clock if view else None)), entry)
    if view is None:
        slot = choose.randrange(min(spec.cap, BLIND_SLOTS))
        return Plan(spec.key, slot, floor, entry)
    # Occupied slots are at most the bookings, so this window always has a free one when the
    # counter has room (as the view shows it).
    window = min(spec.cap, len(view.slots) + len(view.holders) + 1)
    free = [s for s in range(window) if s not in view.slots or view.slots[s][0] not in view.holders]
    slot = choose.choice(free) if free else choose.randrange(max(1, window))
    seen = view.slots.get(slot, ("", 0))[1]
    return Plan(spec.key, slot, max(seen + 1, floor, floor_of(view.clock)), entry)
