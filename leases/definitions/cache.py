"""The process's cache of merged definitions, invalidated by config changes (fail closed).

Entries per (tenant, project, name), served only while the invalidation subscription
(:mod:`leases.definitions.invalidation`) proves that changes made elsewhere reach this
process. The loader is handed in (:func:`leases.definitions.model.load` for the process's
cache, :data:`leases.definitions.model.cache`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

from .schema import SYSTEM_TENANT, TENANT_PROJECT

D = TypeVar("D")


class _Entry(NamedTuple, Generic[D]):
    definition: D
    cached_at: float
    epoch: int


class DefinitionCache(Generic[D]):
    """Merged definitions per (tenant, project, name), invalidated by config changes.

    The cache only serves while it has been told that changes from other processes reach
    this one. The invalidation subscription (attached by the app, :mod:`leases.definitions.invalidation`)
    tells it :meth:`live_until` — the current live epoch and until when (monotonic time) its
    latest proof holds — and :meth:`not_live` when the connection is lost; the cache never
    asks anyone. Without a live proof every read loads the layers. An entry is served only
    in the epoch it was loaded in. A load that raced with an invalidation is not stored
    (generation check), so a change published while a load was in flight can never leave a
    stale entry behind.
    """

    def __init__(self, load: Callable[[str, str, str], D]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], _Entry[D]] = {}
        self._generation = 0
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
        epoch = self.live_epoch()
        entry = self._entries.get(key)
        started = time.monotonic()
        if entry is not None and epoch is not None and entry.epoch == epoch and started - entry.cached_at < max_age:
            return entry.definition
        generation = self._generation
        definition = self._load(name, tenant_id, project_id)
        # Store only if invalidation was live for the whole load: otherwise another
        # process's write could go unnoticed here.
        if epoch is not None and self.live_epoch() == epoch:
            with self._lock:
                if generation == self._generation:
                    self._entries[key] = _Entry(definition, started, epoch)
        return definition

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
