"""Admission of store steps: at most ``LEASES_STORE_CONCURRENCY`` at once per process.

A burst of requests (500 Celery tasks, a class opening its sessions at 9:00) would otherwise
send all their commands at once: the store answers them in turn, each command waits behind
all the others, and past ``LEASES_MONGO_TIMEOUT_MS`` every one of them times out — a
``LeaseUnavailable`` for everyone and, with the retries, an outage caused by demand. Here
each process runs a few steps at a time and the rest wait their turn in the process (before
their store timeout starts), so the store's queue stays short and its answers fast; the
burst drains at the store's own pace.

Only the acquire path's steps are admitted (:func:`leases.engine.step.step`, and the async
path's uncontended try, :func:`admitted_async`, with a budget of the same size per event
loop — a coroutine waits on the loop, never blocking it): releases,
claims and renewals end or complete grants and go at once, so a burst of newcomers never
holds up the slots they wait for. A step within a step is admitted with its outer step. The
wait is bounded (``LEASES_STORE_ADMISSION_MS``, 30 s): past it the step fails as the store
would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator

import pymongo.errors

from ..conf import lease_settings

_local = threading.local()
_lock = threading.Lock()
_gate: "tuple[int, int, _Turns] | None" = None  # (pid, size, turns)
# Event loop -> (size, semaphore): each loop has its own (an asyncio primitive is bound to it).
_loop_gates: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, asyncio.Semaphore]]" = (
    weakref.WeakKeyDictionary())


def _size() -> int:
    """Steps admitted at once (``LEASES_STORE_CONCURRENCY``; 0 or less: no limit)."""
    return int(lease_settings.STORE_CONCURRENCY)


def _bound_s() -> float:
    """The longest a step waits for its turn (``LEASES_STORE_ADMISSION_MS``)."""
    return int(lease_settings.STORE_ADMISSION_MS) / 1000.0


class _Turns:
    """A counting semaphore whose waiters can also be let go by a condition of their own,
    asked again at each turn given back and at each :meth:`recheck` (a wake-up, never a poll:
    1,000 waiting threads polling would take the CPU the store needs)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.taken = 0
        self.changed = threading.Condition(threading.Lock())

    def take(self, unless: Callable[[], bool] | None, bound_s: float) -> bool:
        """A turn (True), or none needed (False).

        Raises:
            pymongo.errors.ExecutionTimeout: neither within ``bound_s``.
        """
        deadline = time.monotonic() + bound_s
        with self.changed:
            while True:
                if self.taken < self.size:
                    self.taken += 1
                    return True
                if unless is not None and unless():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise pymongo.errors.ExecutionTimeout(
                        "too many store steps in flight in this process (LEASES_STORE_CONCURRENCY)")
                self.changed.wait(left)

    def give_back(self) -> None:
        with self.changed:
            self.taken -= 1
            self.changed.notify()

    def recheck(self) -> None:
        with self.changed:
            self.changed.notify_all()


def _turns() -> _Turns | None:
    global _gate
    size = _size()
    if size <= 0:
        return None
    with _lock:
        if _gate is None or _gate[0] != os.getpid() or _gate[1] != size:
            _gate = (os.getpid(), size, _Turns(size))
        return _gate[2]


def _in_event_loop() -> bool:
    # A coroutine must never block its loop on the semaphore (the holder of a slot may be
    # another coroutine of the same loop): the async executor's steps run in its threads.
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@contextlib.contextmanager
def admitted(unless: Callable[[], bool] | None = None) -> Iterator[None]:
    """Run the block as one admitted store step of this process.

    ``unless``: while the step waits its turn, whether it no longer needs one — asked when it
    starts to wait, at each turn given back and at each :func:`recheck`: a step whose
    writes another bound covers (those shared by the threads of a process,
    :mod:`leases.store.batches`) then runs at once.

    Raises:
        pymongo.errors.ExecutionTimeout: not admitted within ``LEASES_STORE_ADMISSION_MS``
            (the callers treat it as a store failure).
    """
    depth = getattr(_local, "depth", 0)
    turns = None if depth or _in_event_loop() else _turns()
    if turns is not None and not turns.take(unless, _bound_s()):
        turns = None
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth
        if turns is not None:
            turns.give_back()


def recheck() -> None:
    """What the steps waiting their turn ask (``unless``) may have changed: they ask again
    (the hint that a gate's backlog is in use, which lets its newcomers' steps go)."""
    with _lock:
        turns = _gate[2] if _gate is not None and _gate[0] == os.getpid() else None
    if turns is not None:
        turns.recheck()


@contextlib.asynccontextmanager
async def admitted_async() -> AsyncIterator[None]:
    """Run the block as one admitted store step of this event loop (the async path's
    uncontended try: 1,000 tasks starting together would otherwise send 1,000 holder writes
    at once and wait on the connection pool past the store bound).

    Raises:
        pymongo.errors.ExecutionTimeout: not admitted within ``LEASES_STORE_ADMISSION_MS``.
    """
    size = _size()
    if size <= 0:
        yield
        return
    loop = asyncio.get_running_loop()
    known = _loop_gates.get(loop)
    if known is None or known[0] != size:
        known = _loop_gates[loop] = (size, asyncio.Semaphore(size))
    semaphore = known[1]
    try:
        await asyncio.wait_for(semaphore.acquire(), timeout=_bound_s())
    except TimeoutError:
        raise pymongo.errors.ExecutionTimeout(
            "too many store steps in flight in this event loop (LEASES_STORE_CONCURRENCY)") from None
    try:
        yield
    finally:
        semaphore.release()
