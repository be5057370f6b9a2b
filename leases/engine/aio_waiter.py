"""The async acquire's wait: the sync engine's queue steps in a thread, its sleeps on the loop.

A level found full hands the attempt (same token, same booking entry) to the sync engine's
queue as steps (:func:`leases.engine.acquire.contended_steps`): the fair queue's order,
hand-off, repair and rollback are the engine's, not a second copy. Its store steps run in a
small thread pool (each ends within the store bound); between them the request sleeps on
the event loop until the process's Redis subscriber wakes it (a thread-safe bridge: no
thread per waiter) or the process's gate watcher nudges it. A caller cancelled while it waits leaves
the queue at once; a slot granted in that moment is released.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import LeaseUnavailable
from .acquire import contended_steps
from .lease import Lease

log = logging.getLogger(__name__)

STEP_THREADS = 16

# Runs the queue's store steps; the waiting between them happens on the event loop, so a
# waiting request holds no thread. Each step ends within the store bound.
EXECUTOR = ThreadPoolExecutor(max_workers=STEP_THREADS, thread_name_prefix="leases-aio")
# Runs the step after a wake-up: most claim a grant, whose claim window runs from the grant,
# so it must not queue behind a burst of newcomers' first steps (a thousand tasks arriving at
# once fill the executor above for seconds).
WOKEN_THREADS = 4
WOKEN_EXECUTOR = ThreadPoolExecutor(max_workers=WOKEN_THREADS, thread_name_prefix="leases-aio-woken")


class _LoopEvent(threading.Event):
    """A waiter's wake-up event: the process's Redis subscriber thread sets it, and that also
    wakes the coroutine sleeping on the loop (a thread-safe bridge, no thread of its own)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self.loop = loop
        self.aio = asyncio.Event()

    def set(self) -> None:
        super().set()
        try:
            self.loop.call_soon_threadsafe(self.aio.set)
        except RuntimeError:  # the loop has closed; nobody sleeps on it any more
            pass

    async def sleep(self, timeout: float) -> bool:
        """Until set or ``timeout`` passes; whether it was set."""
        try:
            await asyncio.wait_for(self.aio.wait(), timeout)
        except TimeoutError:
            pass
        self.aio.clear()
        return self.is_set()


def _advance(steps: Any, woken: bool | None) -> tuple[bool, Any]:
    """One store step of the queue: (False, sleep timeout) or (True, the lease).

    Raises:
        LeaseBusy, LeaseUnavailable: the waiting ended so.
    """
    try:
        _, timeout = steps.send(woken)
        return False, timeout
    except StopIteration as done:
        return True, done.value


async def wait_in_queue(attempt: Any, wait_ms: int, started: float) -> Lease:
    """Wait in the resource's queue with the sync engine's steps (``contended_steps``):
    its store steps in a thread, its sleeps on this loop, woken over the process's Redis
    subscriber; bounded by ``waitMs`` from ``started`` as the sync path.

    Raises:
        LeaseBusy, LeaseUnavailable: as the sync path.
    """
    loop = asyncio.get_running_loop()
    event = _LoopEvent(loop)
    steps = contended_steps(attempt, wait_ms, started, event)
    woken: bool | None = None
    while True:
        step = loop.run_in_executor(WOKEN_EXECUTOR if woken else EXECUTOR, _advance, steps, woken)
        try:
            done, value = await asyncio.shield(step)
        except asyncio.CancelledError:
            # The step still runs in its thread: clean up once it is over.
            step.add_done_callback(lambda finished: EXECUTOR.submit(_abandon, steps, finished))
            raise
        if done:
            return value
        try:
            woken = await event.sleep(value)
        except asyncio.CancelledError:
            EXECUTOR.submit(_abandon, steps, None)
            raise


def _abandon(steps: Any, finished: "asyncio.Future[tuple[bool, Any]] | None") -> None:
    """The caller was cancelled while it waited: a lease granted meanwhile goes straight
    back; a request still in the queue leaves it (closing the steps dequeues it and drops
    its holder document)."""
    if finished is not None:
        if finished.cancelled() or finished.exception() is not None:
            return  # the waiting ended on its own (Busy, Unavailable) and cleaned up
        done, value = finished.result()
        if done:
            _release_quietly(value)
            return
    steps.close()


def _release_quietly(lease: Lease) -> None:
    try:
        lease.release()
    except LeaseUnavailable:
        log.warning("release of %s (caller cancelled) failed; reap and repair return it", lease.token)
