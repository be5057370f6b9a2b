"""The scheduled sweep (§5, §4): idle reap, dead-pod reap and counter reconcile.

Runs from Celery beat (``leases.tasks.sweep``) every ``LEASES_REAP_INTERVAL`` seconds on any
number of pods at once: only the one who deletes a holder decrements, and reconcile writes
only counters that did not change since it read them. Every step is bounded and the sweep
returns ``(done, has_more)``.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from datetime import datetime, timedelta
from typing import Any

from . import listener, metrics, reaper, store
from .handlers import RevokedHolder
from .pods import LeasePodLiveness, liveness as default_liveness

log = logging.getLogger(__name__)

POD_REAP_BATCH = 500
RECONCILE_BATCH = 1000


def _safety_ms() -> int:
    from django.conf import settings

    return int(getattr(settings, "LEASES_RECONCILE_SAFETY_MS", 60000))


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
    """How many holders book each counter key (the value reconcile corrects to).

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


def reconcile(*, now: datetime | None = None, safety_ms: int | None = None,
              limit: int = RECONCILE_BATCH) -> tuple[int, bool]:
    """Recompute counters from holder ``levels`` and correct drift from crash windows.

    Only counters whose ``updatedAt`` is older than the safety margin are touched, and only
    if ``count``/``updatedAt`` are still what was read (compare-and-set), so an acquisition
    in flight (counter incremented, level not yet pushed) is never "corrected". Counters no
    holder books are deleted instead of zeroed. A counter without ``updatedAt`` (created by
    the ``_id`` upsert, never incremented) is first stamped, so it ages like any other.

    Returns:
        ``(corrected, has_more)``; ``corrected`` counts updates and deletions.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    counters = store.counters()
    now = now if now is not None else store.server_now()
    safety_ms = _safety_ms() if safety_ms is None else int(safety_ms)
    cutoff = now - timedelta(milliseconds=safety_ms)
    # Counters first, then holders: anything that moves a counter in between also moves its
    # updatedAt, which the compare-and-set below then refuses.
    candidates = list(counters.find(
        {"$or": [{"updatedAt": {"$lt": cutoff}}, {"updatedAt": {"$exists": False}}]},
        {"count": 1, "updatedAt": 1},
    ))
    if not candidates:
        return 0, False
    booked = booked_counts()
    corrected = 0
    examined = 0
    has_more = False
    for doc in candidates:
        if corrected >= limit:
            has_more = True
            break
        examined += 1
        key, count, updated_at = doc["_id"], doc.get("count"), doc.get("updatedAt")
        want = booked.get(key, 0)
        if updated_at is None:
            counters.update_one({"_id": key, "count": count, "updatedAt": {"$exists": False}},
                                {"$currentDate": {"updatedAt": True}})
            continue
        guard: dict[str, Any] = {"_id": key, "count": count, "updatedAt": updated_at}
        if want == 0:
            if counters.delete_one(guard).deleted_count:
                corrected += 1
                if count:
                    metrics.RECONCILE.labels(outcome="corrected").inc()
                    log.info("reconcile: deleted counter %s (count %s, no holder books it)", key, count)
        elif count != want:
            if counters.update_one(guard, {"$set": {"count": want}, "$currentDate": {"updatedAt": True}}).matched_count:
                corrected += 1
                metrics.RECONCILE.labels(outcome="corrected").inc()
                log.info("reconcile: counter %s corrected %s -> %s", key, count, want)
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
    if idle or pod or corrected:
        log.info("sweep: idle %d, pod %d, reconcile %d", idle, pod, corrected)
    return idle + pod + corrected, idle_more or pod_more or rec_more
