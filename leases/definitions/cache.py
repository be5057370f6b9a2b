"""The process's cache of merged definitions, invalidated by config changes (fail closed).

Entries per (tenant, project, name), served while the invalidation subscription
(:mod:`leases.definitions.invalidation`) proves that changes made elsewhere reach this
process, and otherwise only while younger than the subscription's liveness bound. The loader is handed in (:func:`leases.definitions.model.load` for the process's
cache, :data:`leases.definitions.model.cache`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar, cast

from .schema import SYSTEM_TENANT, TENANT_PROJECT

D = TypeVar("D")


class _Flight:
    """A load of one key in progress: the threads that need the key meanwhile wait for it."""

    def __init__(self, generation: int) -> None:
        self.generation = generation  # the cache's generation when the load began
        self.done = threading.Event()
        self.ok = False
        self.definition: object = None


class _Entry(NamedTuple, Generic[D]):
    definition: D
    cached_at: float
    epoch: int


#: The epoch of an entry loaded while the cache had no live proof (served only while young).
NO_EPOCH = -1


class DefinitionCache(Generic[D]):
    """Merged definitions per (tenant, project, name), invalidated by config changes.

    The cache only serves while it has been told that changes from other processes reach
    this one. The invalidation subscription (attached by the app, :mod:`leases.definitions.invalidation`)
    tells it :meth:`live_until` — the current live epoch and until when (monotonic time) its
    latest proof holds — and :meth:`not_live` when the connection is lost; the cache never
    asks anyone. An entry is served in the epoch it was loaded in while the proof holds, and
    with no proof in force only while it is younger than the liveness bound (it holds every change made
    before its load: a change reaches every process within the bound either way). Without
    a live proof, then, each entry is loaded again once a bound. A load that raced with an
    invalidation is not stored (generation check), so a change published while a load was
    in flight can never leave a stale entry behind.
    """

    def __init__(self, load: Callable[[str, str, str], D]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], _Entry[D]] = {}
        self._generation = 0
        self._flights: dict[tuple[str, str, str], _Flight] = {}
        # (epoch, monotonic deadline of the latest proof, pid told), replaced as a whole so
        # a reader never sees one epoch with another epoch's deadline; None: not live. A
        # forked child inherits the parent's proof but not the thread that earned it.
        self._live: tuple[int, float, int] | None = None

    def live_until(self, epoch: int, deadline: float) -> None:
        """Told: every change published elsewhere reaches this process until ``deadline`` (monotonic)."""
        self._live = (epoch, deadline, os.getpid())

    def not_live(self) -> None:
        """Told: changes may not reach this process any more; serve nothing until told again."""
        self._live = None
        self.clear()

    def live_epoch(self) -> int | None:
        """The epoch the cache serves in now, or None while it has no live proof."""
        live = self._live
        if live is None or time.monotonic() >= live[1] or live[2] != os.getpid():
            return None
        return live[0]

    def get(self, name: str, tenant_id: str, project_id: str) -> D:
        """Cached merged definition, loading on a miss or while invalidation is not live.

        Raises:
            LeaseUnavailable: the load failed; nothing is cached.
        """
        from leases.conf import lease_settings

        key = (tenant_id, project_id, name)
        max_age = float(lease_settings.DEFINITION_CACHE_SECONDS)
        bound = int(lease_settings.INVALIDATION_LIVENESS_MS) / 1000.0
        epoch = self.live_epoch()
        entry = self._entries.get(key)
        started = time.monotonic()
        if entry is not None and started - entry.cached_at < max_age and (
                entry.epoch == epoch if epoch is not None else started - entry.cached_at < bound):
            # Proven (every change published elsewhere reached us within the bound), or, with
            # no proof in force, loaded less than the bound ago: it holds every change made
            # before its load, so it is as fresh as a proof would make it (an entry of an
            # earlier epoch is never served once a new one is proven). Under CPU starvation
            # the proof lapses (its ping is answered late) while nothing changed: without the
            # second rule every request of every thread would read the layers again, and
            # those reads would starve the process further.
            return entry.definition
        with self._lock:
            generation = self._generation
            flight = self._flights.get(key)
            leader = flight is None or flight.generation != generation
            if leader:
                flight = self._flights[key] = _Flight(generation)
        assert flight is not None
        if not leader:
            # Another thread is loading this key right now (a burst of requests found the
            # entry missing together): its load began before this request, so its result
            # is as fresh as one of our own — unless a change was applied since it began.
            if flight.done.wait(self._flight_wait_s()) and flight.ok and flight.generation == self._generation:
                return cast(D, flight.definition)
            return self._load(name, tenant_id, project_id)  # it failed or is slow: on our own
        try:
            definition = self._load(name, tenant_id, project_id)
            flight.definition, flight.ok = definition, True
            with self._lock:
                # Not if a change was applied during the load: the load may predate it.
                if generation == self._generation:
                    self._entries[key] = _Entry(definition, started, epoch if epoch is not None and
                                                self.live_epoch() == epoch else NO_EPOCH)
            return definition
        finally:
            with self._lock:
                if self._flights.get(key) is flight:
                    del self._flights[key]
            flight.done.set()

    @staticmethod
    def _flight_wait_s() -> float:
        # A load is a few store reads, each bounded by the store timeout.
        from leases.conf import lease_settings

        return 2 * int(lease_settings.MONGO_TIMEOUT_MS) / 1000.0

    def invalidate(self, tenant_id: str | None, project_id: str | None, name: str | None) -> None:
        """Drop entries touched by a change of (tenant, project, name).

        A System-layer change drops the name for every tenant and project, a Tenant-layer
        change for every project of that tenant; ``None`` everywhere drops all.
        """
        with self._lock:
            self._generation += 1
            if name is None:
                self._entries.clear()
                return
            for key in list(self._entries):
                t, p, n = key
                if n != name:
                    continue
                if tenant_id == SYSTEM_TENANT and project_id == TENANT_PROJECT:
                    del self._entries[key]
                elif project_id == TENANT_PROJECT and t == tenant_id:
                    del self._entries[key]
                elif (t, p) == (tenant_id, project_id):
                    del self._entries[key]

    def clear(self) -> None:
        """Drop everything."""
        self.invalidate(None, None, None)
