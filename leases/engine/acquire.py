"""The acquire entry points: ``acquire``, ``acquire_or_ticket``, and the contended steps
the async acquire hands over to.

One request: prepare (validate, resolve) → the funnel's first try under one step bound →
granted, or Busy after one fail-fast repair (no wait allowed), or the waiter (the gate's
queue) until granted, Busy at the wait bound, or a kept ticket.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator

from .fail_fast import fail_fast
from .funnel import Attempt, _Blocked, deep_queue_expected, first
from .lease import NOOP, Lease, NoopLease
from .outcome import outcome
from .prepare import prepare
from .request import LeaseRequest
from .step import Bypass, step
from .ticket import Ticket
from .waiter import Waiter


def acquire(request: LeaseRequest) -> Lease | NoopLease:
    """Acquire a slot at every capped level of the request's lease, waiting up to ``waitMs``.

    A level found full puts the request in the resource's queue (see ``leases.queue.waiting``);
    it is granted in the order rule's turn or ends with ``LeaseBusy`` at the wait bound.

    Returns:
        A :class:`Lease`, or ``NOOP`` (no MongoDB traffic) when no lease is referenced or the
        definition has no caps.

    Raises:
        InvalidLeaseRequest: bad input (nothing written); ``UnknownLeaseType`` for a type
            without handler; ``InvalidDefinition`` for a refused inline definition.
        LeaseBusy: a level stayed full for the whole wait (with the level, occupancy and
            the place the request had in the queue).
        LeaseUnavailable: MongoDB unreachable or broken configuration (fail-closed); each
            store step ends within ``LEASES_MONGO_TIMEOUT_MS``.
    """
    lease = acquire_request(request, keep_ms=None)
    assert not isinstance(lease, Ticket)  # only a kept place (keep_ms) answers a ticket
    return lease


def acquire_request(request: LeaseRequest, *, keep_ms: int | None) -> "Lease | NoopLease | Ticket":
    """Prepare ``request`` and run it, its outcome counted; ``keep_ms``: keep a ticket at
    the wait bound instead of answering Busy.

    Raises:
        The errors of :func:`acquire`.
    """
    prepared = prepare(request)
    if prepared is None:
        return NOOP
    attempt, wait_ms = prepared
    started = time.monotonic()
    with outcome(attempt) as record:
        return record(run(attempt, wait_ms, started, keep_ms))


def run(attempt: Attempt, wait_ms: int, started: float, keep_ms: int | None) -> "Lease | Ticket":
    """The first try, then fail-fast (no wait) or the queue until ``wait_ms`` from ``started``.

    Raises:
        LeaseBusy, LeaseUnavailable: as :func:`acquire`.
    """
    deadline = started + wait_ms / 1000.0
    queues = wait_ms > 0 or keep_ms is not None
    # Bound for a deep queue: the holder goes with those of this process's other newcomers
    # (leases.store.batches), not one step's turn at a time.
    deep = Bypass(lambda: queues and deep_queue_expected(attempt, wait_ms))
    result = step(attempt, lambda: first(attempt, allow_queue=queues, wait_ms=wait_ms, deep=deep.chosen), bypass=deep)
    if isinstance(result, Lease):
        return result
    if not queues:
        return step(attempt, lambda: fail_fast(attempt, result))
    return Waiter(attempt, deadline, started, keep_ms=keep_ms).wait(result)


def contended_steps(attempt: Attempt, wait_ms: int, started: float,
                    event: threading.Event | None = None) -> Generator["tuple[threading.Event, float]", "bool | None", Lease]:
    """Acquire for an attempt whose uncontended try (the async executor's) found no room,
    as steps (see :meth:`Waiter.steps`): the funnel once more with its diagnosis and
    repair, then the queue, up to ``wait_ms`` from ``started``.

    Raises:
        LeaseBusy, LeaseUnavailable: as :func:`acquire`.
    """
    queues = wait_ms > 0

    def again() -> "Lease | _Blocked":
        # The uncontended try wrote the holder document a moment ago.
        try:
            return attempt.book(privileged=False, allow_queue=queues)
        except _Blocked as blocked:
            return blocked

    result = step(attempt, again)
    if isinstance(result, Lease):
        return result
    if not queues:
        return step(attempt, lambda: fail_fast(attempt, result))
    waiter = Waiter(attempt, started + wait_ms / 1000.0, started)
    # A grant the wake-up told of is answered at once and marked from the background, as
    # for the blocking API: the async lease waits for the mark before a check and drops
    # it at release (leases.engine.aio_lease).
    waiter.claim_later = True
    lease = yield from waiter.steps(result, event)
    assert isinstance(lease, Lease)  # without keep_ms the wait never ends in a ticket
    return lease


def acquire_or_ticket(request: LeaseRequest, *, keep_ms: int) -> "Lease | NoopLease | Ticket":
    """Like :func:`acquire`, but when the wait ends without a slot the request keeps its
    place: a :class:`Ticket` that lives ``keep_ms`` past each :func:`resume`.

    Only named leases queue this way (an inline definition is not stored to resume from);
    an inline request answers ``LeaseBusy`` as :func:`acquire` does.

    Raises:
        The errors of :func:`acquire`.
    """
    return acquire_request(request, keep_ms=None if request.inline is not None else keep_ms)
