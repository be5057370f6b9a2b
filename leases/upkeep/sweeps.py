"""The scheduled sweep: idle reap, dead-pod reap and counter reconcile — the safety net for
everything a crashed process or a missed release leaves behind.

Runs from Celery beat (``leases.tasks.sweep``) every ``LEASES_REAP_INTERVAL`` seconds on any
number of pods at once: only the one who deletes a holder decrements, and reconcile writes
only counters that did not change since it read them. Every step is bounded and the sweep
returns ``(done, has_more)``.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from datetime import datetime, timedelta

from ..definitions import caps
from ..pods.liveness import LeasePodLiveness, liveness as default_liveness
from ..queue import presence, slots, waiting
from ..revocation import listener
from ..revocation.handlers import RevokedHolder
from ..store import client as store, counter_commands, entries
from ..store.documents import HolderDoc
from ..telemetry import metrics
from . import reaper

log = logging.getLogger(__name__)

POD_REAP_BATCH = 500
RECONCILE_BATCH = 1000
ORPHAN_BATCH = 1000
# What reconcile reads of a counter besides its entries to settle a cap stamp left pending.
SETTLE_FIELDS = {"capStamps": 1, "cap": 1, "level": 1, "scope": 1, "tenantId": 1, "resource": 1}


def _safety_ms() -> int:
    from leases.conf import lease_settings

    return int(lease_settings.RECONCILE_SAFETY_MS)


def reap_dead_pods(*, now: datetime | None = None, limit: int = POD_REAP_BATCH,
                   liveness: LeasePodLiveness | None = None, dispatch: bool = True) -> tuple[int, bool]:
    """Release every lease of every dead pod at once (reason ``pod``).

    Detached holders (``pod == ""``) never qualify: only their idle TTL applies. The
    own pod is always alive, so a pod never reaps its own leases this way.

    Returns:
        ``(reaped, has_more)``.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    liveness = liveness or default_liveness
    now = now if now is not None else store.server_now()
    dead = liveness.dead_holder_pods(now=now)
    if not dead:
        return 0, False
    candidates = list(store.holders().find({"pod": {"$in": dead}}, {"_id": 1, "pod": 1}).limit(limit + 1))
    has_more = len(candidates) > limit
    reaped: list[RevokedHolder] = []
    for doc in candidates[:limit]:
        # The pod is part of the delete filter: a holder is only taken for the pod judged dead.
        holder = reaper.reap_holder({"_id": doc["_id"], "pod": doc["pod"]}, "pod")
        if holder is not None:
            reaped.append(holder)
    if reaped:
        log.info("pod reap: %d holders of dead pods %s", len(reaped), ", ".join(dead[:10]))
        if dispatch:
            listener.notify(reaped)
    return len(reaped), has_more


def booked_counts() -> Tally:
    """How many held holders register each counter key (the BOOKED column).

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    booked: Tally = Tally()
    for row in store.holders().aggregate([
        {"$match": {"levels.0": {"$exists": True}}},
        {"$unwind": "$levels"},
        {"$group": {"_id": "$levels", "n": {"$sum": 1}}},
    ]):
        booked[row["_id"]] = int(row["n"])
    return booked


def convert_legacy_counters(*, limit: int = 10000) -> int:
    """Give every counter written before bookings had entries its list, now (no safety
    margin: for the migration, with the old code stopped). Returns how many changed.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    changed = 0
    while True:
        legacy = list(store.counters().find({"holders": {"$exists": False}}, {"count": 1, "updatedAt": 1})
                      .limit(limit))
        if not legacy:
            return changed
        booked_by = slots.entries_by_key([d["_id"] for d in legacy])
        now = store.server_now() + timedelta(days=1)
        changed += sum(slots.convert_legacy(doc, booked_by, safety=timedelta(0), now=now) for doc in legacy)
        if len(legacy) < limit:
            return changed


def reconcile(*, now: datetime | None = None, safety_ms: int | None = None,
              limit: int = RECONCILE_BATCH) -> tuple[int, bool]:
    """Make every counter book exactly its live holders; the safety net behind lazy repair.

    * A booking entry whose holder document is gone (or was written again since: another
      ``attemptId``) is pulled by value (exact: a holder is always written before its first
      entry, a holder written again books another value, and pulling an entry twice is
      impossible), so no counter has to go quiet first.
    * A ``count`` that differs from its list of entries (a hand edit) is set to the list's
      length, guarded by ``count``/``updatedAt`` as read.
    * A counter written before entries existed gets its list from the holders that register
      it, once it is older than the safety margin (``LEASES_RECONCILE_SAFETY_MS``).
    * A counter nobody books or queues on, untouched for the safety margin, is deleted
      (the next acquisition creates it again) — unless it has issued fences: its ``fence``
      slots are where their generations live (:mod:`leases.queue.fences`), so it stays.
    * Stale tickets (their waiters are gone) are pruned from the queues.
    * A counter in use still bound by the cap stamp it was born with (its creator stopped
      before stamping it from a fresh read) is stamped so (:func:`leases.definitions.caps.settle_left`).

    Returns:
        ``(corrected, has_more)``; ``corrected`` counts pulled entries, count corrections,
        conversions that changed a count, and deletions of counters that still counted.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    counters = store.counters()
    now = now if now is not None else store.server_now()
    safety = timedelta(milliseconds=_safety_ms() if safety_ms is None else int(safety_ms))
    corrected = 0
    has_more = False

    legacy = list(counters.find({"holders": {"$exists": False}}, {"count": 1, "updatedAt": 1}).limit(limit + 1))
    if legacy:
        has_more = len(legacy) > limit
        legacy = legacy[:limit]
        booked_by = slots.entries_by_key([d["_id"] for d in legacy])
        for doc in legacy:
            if slots.convert_legacy(doc, booked_by, safety=safety, now=now) and \
                    doc.get("count") != len(booked_by.get(doc["_id"], [])):
                corrected += 1
                metrics.RECONCILE.labels(outcome="corrected").inc()

    booked = list(counters.find({"holders.0": {"$exists": True}}, {"holders": 1}).limit(limit + 1))
    has_more = has_more or len(booked) > limit
    booked = booked[:limit]
    # The holders that exist, read after the counters (a holder is written before its first
    # entry, so an entry read above whose holder is missing here is an orphan). Few tokens:
    # look them up; many: one projected scan is cheaper than many long $in lists.
    tokens = sorted({entries.token_of(e) for doc in booked for e in doc["holders"]})
    alive: dict[str, HolderDoc] = {}
    if len(tokens) <= ORPHAN_BATCH:
        alive.update((d["_id"], d) for d in store.holders().find({"_id": {"$in": tokens}}, {"attemptId": 1}))
    else:
        alive.update((d["_id"], d) for d in store.holders().find({}, {"attemptId": 1}))
    for doc in booked:
        # Also an entry of an earlier attempt of a holder written again (entries.superseded).
        for booking in [e for e in doc["holders"] if entries.superseded(e, alive.get(entries.token_of(e)))]:
            after = slots.pull_entry(doc["_id"], booking)
            if after is not None:
                corrected += 1
                metrics.RECONCILE.labels(outcome="corrected").inc()
                log.info("reconcile: %s booked %s, whose holder is gone (or a later attempt); returned", doc["_id"],
                         entries.token_of(booking))
                waiting.hand_off(after)

    for doc in counters.find({"holders": {"$exists": True}}, {"count": 1, "holders": 1, "updatedAt": 1,
                                                            "queue": 1, "clock": 1, **SETTLE_FIELDS}).limit(limit):
        booked_entries = doc.get("holders") or []
        if (booked_entries or doc.get("queue")) and doc.get("capStamps") and (
                doc.get("updatedAt") is None or doc["updatedAt"] < now - safety):
            caps.settle_left(doc)  # born pending, its creator stopped before settling it (an idle one goes)
        if doc.get("count") != len(booked_entries):
            if counters.update_one(*counter_commands.recount(doc, len(booked_entries))).matched_count:
                corrected += 1
                metrics.RECONCILE.labels(outcome="corrected").inc()
                log.info("reconcile: counter %s corrected %s -> %d", doc["_id"], doc.get("count"), len(booked_entries))
        elif not booked_entries and not doc.get("queue") and (doc.get("updatedAt") is None or doc["updatedAt"] < now - safety):
            counters.delete_one(counter_commands.drop_idle(doc))
        if doc.get("queue"):
            waiting.prune({**doc, "clock": now})
    return corrected, has_more


def prune_pods(*, now: datetime | None = None, older_than: timedelta = timedelta(days=1), limit: int = 100) -> int:
    """Forget pod documents dead for longer than ``older_than`` that hold no lease.

    Host-pid pod ids change on every restart; without this the registry only grows.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    now = now if now is not None else store.server_now()
    pods = store.pods()
    removed = 0
    for doc in pods.find({"expiryDeadline": {"$lt": now - older_than}}, {"_id": 1, "expiryDeadline": 1}).limit(limit):
        if store.holders().find_one({"pod": doc["_id"]}, {"_id": 1}) is None:
            removed += pods.delete_one({"_id": doc["_id"], "expiryDeadline": doc["expiryDeadline"]}).deleted_count
    return removed


def prune_presence(*, now: datetime | None = None, older_than: timedelta = timedelta(hours=1)) -> int:
    """Forget the heartbeats of waiting processes silent for longer than ``older_than``
    (:mod:`leases.queue.presence`: one document per process that ever waited; a ticket is
    stale after the ticket TTL, so an hour-old heartbeat keeps nobody alive).

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    now = now if now is not None else store.server_now()
    return store.presence().delete_many(presence.sweep_filter(now - older_than)).deleted_count


def sweep(*, limit: int = reaper.REAP_BATCH, reconcile_counters: bool = True) -> tuple[int, bool]:
    """One bounded sweep round: idle reap, dead-pod reap, reconcile.

    Returns:
        ``(done, has_more)``: holders reaped plus counters corrected, and whether any step
        stopped at its bound.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    now = store.server_now()
    idle, idle_more = reaper.reap_idle(now=now, limit=limit)
    pod, pod_more = reap_dead_pods(now=now, limit=limit)
    corrected, rec_more = (0, False)
    if reconcile_counters:
        corrected, rec_more = reconcile(now=now)
    prune_pods(now=now)
    prune_presence(now=now)
    if idle or pod or corrected:
        log.info("sweep: idle %d, pod %d, reconcile %d", idle, pod, corrected)
    return idle + pod + corrected, idle_more or pod_more or rec_more
