"""Every slot comes back: the one promise the checker judges from the store, not the history.

What the clients were told cannot show a slot that nobody holds but nobody can take either
(an entry left by a half-applied command, a fence slot recorded twice for one booking, a
granted ticket nobody will ever poll): its only trace is capacity that never returns. So:

* **during the run** (:class:`Monitor`, a read every ``period`` s): no counter books more
  entries than its cap or a ``count`` other than its entries, and no booking entry occupies
  two slots of a fence counter (a slot is occupied while its recorded entry is booked,
  :mod:`leases.queue.fences`, so one booking on two slots takes a slot from the level);
* **at the end** (:func:`final_audit`), once every client process is gone and every
  deadline a dead client leaves (a holder's TTL, a ticket's TTL, a kept ticket's poll
  deadline) has passed: a sweep as the operator runs it (``lease sweep --force``: idle reap,
  dead-pod reap, reconcile; then one repair of every counter, the lazy check every full
  counter gets, and a reconcile to the end); after it, every counter's entries name live
  holders (their ``attemptId``) and, with every client gone, every counter is empty: no
  entry, no queued ticket, and no holder document is left.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pymongo.errors


@dataclass(frozen=True)
class SlotProblem:
    """One way capacity did not come back (``when``: monotonic time of the read)."""

    kind: str  # over-cap | count | double-slot | orphan-entry | left-booked | left-queued | left-holder
    key: str
    when: float
    detail: str

    def __str__(self) -> str:
        return f"slot ({self.kind}) {self.key} at t={self.when:.3f}: {self.detail}"


def _fence_slots(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Booked entry -> the fence slots that record it (only entries still booked occupy a slot)."""
    booked = set(doc.get("holders") or ())
    by_entry: dict[str, list[str]] = {}
    for name, value in (doc.get("fence") or {}).items():
        if isinstance(value, dict) and value.get("e") in booked:
            by_entry.setdefault(value["e"], []).append(name)
    return by_entry


def counter_problems(doc: dict[str, Any], when: float) -> list[SlotProblem]:
    """What is wrong with one counter document at any instant (no holder reads)."""
    found = []
    entries = doc.get("holders") or []
    if len(entries) > int(doc.get("cap") or 0):
        found.append(SlotProblem("over-cap", doc["_id"], when, f"{len(entries)} entries > cap {doc.get('cap')}"))
    if "count" in doc and doc["count"] != len(entries):
        # A command sets count with its entries in one update; other values are drift.
        found.append(SlotProblem("count", doc["_id"], when, f"count {doc['count']} != {len(entries)} entries"))
    for entry, names in sorted(_fence_slots(doc).items()):
        if len(names) > 1:
            found.append(SlotProblem("double-slot", doc["_id"], when,
                                     f"entry {entry} occupies fence slots {sorted(names)} (cap {doc.get('cap')})"))
    return found


@dataclass
class Monitor:
    """Reads every counter each ``period`` seconds in a thread of its own and keeps the problems.

    The read goes straight to the store (never through the run's proxy); a read that fails
    (the store stopped) is skipped. A problem seen on consecutive reads is kept once.
    """

    period: float = 0.5
    problems: list[SlotProblem] = field(default_factory=list)
    reads: int = 0
    last_booked: dict[str, float] = field(default_factory=dict)  # holder token -> last read that saw it booked
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="slot-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        from leases.store import client as store, entries as entry_codec

        seen: set[tuple[str, str, str]] = set()
        while not self._stop.wait(self.period):
            try:
                docs = list(store.counters().find({}, {"holders": 1, "count": 1, "cap": 1, "fence": 1}))
            except pymongo.errors.PyMongoError:
                continue
            self.reads += 1
            now = time.monotonic()
            current = set()
            for doc in docs:
                for entry in doc.get("holders") or ():
                    self.last_booked[entry_codec.token_of(entry)] = now
                for problem in counter_problems(doc, now):
                    key = (problem.kind, problem.key, problem.detail)
                    current.add(key)
                    if key not in seen:
                        self.problems.append(problem)
            seen = current


def final_sweep() -> dict[str, Any]:
    """The operator's sweep, then one repair of every counter and reconcile to the end.

    Returns:
        ``{"sweep": ..., "repaired": n, "reconcile": ...}`` (the tallies, for the report).
    """
    from leases.queue import waiting
    from leases.store import client as store
    from leases.upkeep import rounds

    swept, _ = rounds.sweep_without_handlers()
    now = store.server_now()
    repaired = 0
    for doc in list(store.counters().find({})):
        doc.pop("checkedAt", None)  # the audit's own check: not subject to another's interval
        try:
            repaired += bool(waiting.repair(doc, now))
        except pymongo.errors.PyMongoError:
            pass
    return {"sweep": swept, "repaired": repaired, "reconcile": rounds.reconcile_until_done(safety_ms=0)}


def final_audit(*, all_gone: bool = True) -> list[SlotProblem]:
    """After :func:`final_sweep`: entries without a live holder, and (all clients gone) anything left."""
    from leases.store import client as store, entries as entry_codec

    now = time.monotonic()
    counters = list(store.counters().find({}))
    holders = {d["_id"]: d for d in store.holders().find({}, {"attemptId": 1, "state": 1, "expiresAt": 1,
                                                               "resource": 1, "pod": 1})}
    found = []
    for doc in counters:
        found.extend(counter_problems(doc, now))
        for entry in doc.get("holders") or ():
            holder = holders.get(entry_codec.token_of(entry))
            if entry_codec.superseded(entry, holder):
                found.append(SlotProblem("orphan-entry", doc["_id"], now, f"entry {entry} names no live holder"))
            elif all_gone:
                found.append(SlotProblem("left-booked", doc["_id"], now,
                                         f"entry {entry} still booked for holder {dict(holder or {})}"))
        if all_gone and doc.get("queue"):
            found.append(SlotProblem("left-queued", doc["_id"], now,
                                     f"{len(doc['queue'])} tickets queued: {[t.get('id') for t in doc['queue']][:5]}"))
    if all_gone:
        booked_tokens = {entry_codec.token_of(e) for doc in counters for e in doc.get("holders") or ()}
        for token, holder in sorted(holders.items()):
            if token not in booked_tokens:
                found.append(SlotProblem("left-holder", "holders", now, f"holder {token} left: {dict(holder)}"))
    return found


def kept_past_deadline(run_dir: str, last_booked: dict[str, float], *, keep_s: float, ttl_s: float,
                       slack_s: float = 1.0) -> list[SlotProblem]:
    """HTTP kept tickets left behind (``tests.workers.http_ticket_client`` logs ``h*.log``) whose
    slot outlived what the client was told.

    A ticket whose client vanished without hearing of a grant lives until its poll deadline
    (its last answered poll + three poll intervals): the monitor must not see its token
    booked after that (+ ``slack_s``: the monitor's period and the clocks' offsets). One
    whose client heard its grant is a lease: booked at most a TTL after that answer.
    """
    import json
    import os

    found = []
    for name in sorted(os.listdir(run_dir)):
        if not (name.startswith("h") and name.endswith(".log")):
            continue
        with open(os.path.join(run_dir, name), encoding="utf-8") as handle:
            lines = [json.loads(raw) for raw in handle if raw.endswith("\n")]
        vanished = [line for line in lines if line["what"] == "vanish"]
        if not vanished:
            continue
        ticket = vanished[-1]["ticket"]
        answered = [line["at"] for line in lines if ticket in (line.get("ticket"), line.get("token"))
                    and line["what"] in ("post", "poll") and line.get("status") in (200, 201, 202)]
        if not answered:
            continue
        if vanished[-1].get("token"):  # it heard its grant: a lease of TTL ttl_s from that answer
            limit, what = max(answered) + ttl_s, "its lease's TTL"
        else:
            limit, what = max(answered) + keep_s, "its poll deadline"
        seen = last_booked.get(ticket)
        if seen is not None and seen > limit + slack_s:
            found.append(SlotProblem("kept-past-deadline", name[:-4], seen,
                                     f"ticket {ticket} booked {seen - limit:.1f}s past {what} "
                                     f"(its client's last answer at t={max(answered):.3f}, keep {keep_s:.0f}s)"))
    return found
