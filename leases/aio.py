"""The consumer contract for asyncio (ASGI views, asyncio consumers), on pymongo's async client.

::

    async with leases.aacquire(request) as lease:     # or: lease = await leases.aacquire(request)
        await lease.aupdate_payload({"jobId": job_id})
        while not done:
            await lease.acheck()                      # LeaseLost once reaped or revoked
    # released here (or: await lease.arelease())

The same commands as the sync path (``leases.store.holder_commands``, ``slots.take_ops``), the same
errors and the same bounds: every step runs under one ``pymongo.timeout`` of
``LEASES_MONGO_TIMEOUT_MS``. The uncontended path — holder, the one ordered bulk over the
stacked levels, HELD; check; release — runs on the event loop's ``AsyncMongoClient``.

A level found full hands the attempt (same token, same booking entry) to the sync engine's
queue as steps (``leases.engine.acquire.contended_steps``): the fair queue's order, hand-off, repair and
rollback are the engine's, not a second copy of them. Its store steps run in a small thread
pool (each ends within the store bound); between them the request sleeps on the event loop
until the process's Redis subscriber wakes it (a thread-safe bridge: no thread per waiter)
or the process's gate watcher nudges it; ``waitMs`` bounds the whole wait as on the sync path. A
caller cancelled while it waits leaves the queue at once (its ticket and holder document are
dropped); a slot granted in that moment is released.

One async client per event loop (pymongo's async client must not cross loops); call
:func:`aclose` before a loop that used it ends.

The code lives in :mod:`leases.engine` (``aio_acquire``, ``aio_lease``, ``aio_waiter``,
``aio_counters``); this module keeps the names every caller imports from here.
"""

from __future__ import annotations

from .engine.aio_acquire import _acquire, _Acquiring, _rollback, _uncontended, aacquire
from .engine.aio_counters import give_back as _give_back
from .engine.aio_lease import ANOOP, AsyncLease, AsyncNoopLease as _AsyncNoopLease
from .engine.aio_waiter import (
    EXECUTOR as _EXECUTOR,
    STEP_THREADS,
    WOKEN_THREADS,
    _abandon,
    _advance,
    _LoopEvent,
    _release_quietly,
    wait_in_queue as _wait_in_queue,
)
from .store import client as store

aclose = store.aclose

__all__ = [
    "ANOOP", "STEP_THREADS", "WOKEN_THREADS", "AsyncLease", "aacquire", "aclose",
    "_Acquiring", "_AsyncNoopLease", "_EXECUTOR", "_LoopEvent", "_abandon", "_acquire", "_advance", "_give_back",
    "_release_quietly", "_rollback", "_uncontended", "_wait_in_queue",
]
