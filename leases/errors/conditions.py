"""The lease conditions every layer raises: busy, unavailable, lost, invalid requests, unknown
holders and audit entries; :class:`LeaseError` is the base of the whole hierarchy.
"""

from __future__ import annotations


class LeaseError(Exception):
    """Base of every lease error; ``code`` is the stable, machine-readable name."""

    code = "LEASE_ERROR"


class LeaseBusy(LeaseError):
    """A level stayed full for the whole wait; carries the diagnosis.

    ``position`` is the place the request had in the resource's queue when it gave up
    (None when it did not queue); ``retry_after`` a suggested delay in seconds before
    trying again, never None: the engine sets the queue's estimate of the request's turn
    (else the gate's typical hold, else :attr:`DEFAULT_RETRY_AFTER_S`), counting the
    current holders' remaining expected hold (holders past the typical hold are expected to
    hold about as long again) and never below the floor ``LEASES_RETRY_AFTER_MIN_MS``
    (default 100 ms), so a caller that sleeps it does not spin; the HTTP client sets the
    server's ``Retry-After``; without one it is :attr:`DEFAULT_RETRY_AFTER_S`. It says when
    to try next, not how long this call waited: that was at most ``min(request wait_ms,
    definition waitMs)``, 0 for a lease without ``waitMs``.
    """

    code = "LEASE_BUSY"
    #: The suggested delay when nothing better is known (the HTTP ``Retry-After`` floor).
    DEFAULT_RETRY_AFTER_S = 1.0

    def __init__(self, *, resource: str, level: str, scope: str, count: int | None, cap: int,
                 position: int | None = None, retry_after: float | None = None, queue_full: bool = False):
        self.queue_full = queue_full  # refused at once: the resource's queue holds LEASES_QUEUE_LIMIT tickets
        self.resource = resource
        self.level = level
        self.scope = scope
        self.count = count
        self.cap = cap
        self.position = position
        self.retry_after: float = self.DEFAULT_RETRY_AFTER_S if retry_after is None else float(retry_after)
        where = f", queue position {position}" if position is not None else ""
        where += ", queue full" if queue_full else ""
        super().__init__(
            f"lease busy: resource {resource!r} level {level} scope {scope!r} holds {count}/{cap}{where}"
        )


class LeaseRetriesExhausted(LeaseBusy):
    """A task retried on a busy resource as often as it may (``leases.contrib.celery``).

    ``retries`` is how many retries it spent; ``resource``, ``level`` and ``position`` what
    the last attempt saw. The message alone rebuilds it, so it survives a result backend.
    """

    code = "LEASE_RETRIES_EXHAUSTED"

    def __init__(self, message: str = "", *, retries: int | None = None, resource: str = "", level: str = "",
                 position: int | None = None):
        self.retries = retries
        self.resource = resource
        self.level = level
        self.scope = ""
        self.count = None
        self.cap = 0
        self.position = position
        self.retry_after = self.DEFAULT_RETRY_AFTER_S
        where = f", queue position {position}" if position is not None else ""
        LeaseError.__init__(self, message or (
            f"lease still busy after {retries} retries: resource {resource!r} level {level or '?'}{where}"))


class LeaseUnavailable(LeaseError):
    """The lease cannot be decided: store unreachable or broken configuration (fail-closed)."""

    code = "LEASE_UNAVAILABLE"


class LeaseLost(LeaseError):
    """The lease is no longer held (idle reap, pod reap or operator revocation)."""

    code = "LEASE_LOST"


class StaleLease(LeaseLost):
    """A lease token the store does not know (never issued, or not visible to the caller)."""

    code = "STALE_LEASE"


class LeaseExpired(LeaseLost):
    """A lease token that ended: idle-reaped, pod-reaped, revoked, released or past its deadline."""

    code = "EXPIRED"

    def __init__(self, message: str = "", *, reason: str | None = None):
        # idle (also: a renewal that came after the deadline), pod, revoke, release,
        # ticket-expired, abandoned, waiter-gone.
        self.reason = reason
        super().__init__(message)


class InvalidLeaseRequest(LeaseError, ValueError):
    """The caller passed bad input; nothing was written."""

    code = "INVALID_REQUEST"


class UnknownLeaseType(InvalidLeaseRequest):
    """The request names a ``type`` without a registered handler."""

    code = "UNKNOWN_LEASE_TYPE"


class UnknownLease(InvalidLeaseRequest):
    """The request names a lease no layer defines, and ``LEASES_UNDEFINED_LEASE`` is
    ``"error"`` (by default such a name acquires ``NOOP``). Over HTTP: 400."""

    code = "UNKNOWN_LEASE"


class PriorityNotAllowed(InvalidLeaseRequest):
    """The request names a priority class its tenant may not use (never silently downgraded)."""

    code = "PRIORITY_NOT_ALLOWED"


class HandlerAlreadyRegistered(LeaseError):
    """A second, different handler was registered for a lease type without ``replace=True``."""

    code = "HANDLER_ALREADY_REGISTERED"


class InvalidDefinition(InvalidLeaseRequest):
    """An inline definition or a config document that was refused on write."""

    code = "INVALID_DEFINITION"


class HolderNotFound(LeaseError, LookupError):
    """No holder with that token (in the caller's tenant); also said for other tenants' tokens."""

    code = "HOLDER_NOT_FOUND"


class AuditEntryNotFound(LeaseError, LookupError):
    """No audit record with that id (in the caller's tenant); also said for other tenants' ids."""

    code = "AUDIT_ENTRY_NOT_FOUND"


class StaleFence(LeaseError):
    """A fence older than one the resource has already admitted for the same slot: its
    holder's lease is gone and the slot belongs to a newer holder (:mod:`leases.fencing`)."""

    code = "STALE_FENCE"

    def __init__(self, message: str = "", *, counter: str | None = None, slot: int | None = None,
                 generation: int | None = None, seen: int | None = None):
        self.counter = counter
        self.slot = slot
        self.generation = generation
        self.seen = seen  # the newer generation the guard holds, when it said (None: not read)
        super().__init__(message)


class InvalidFence(InvalidLeaseRequest):
    """A fence string that is no fence the engine issued (malformed, wrong version, out of
    range); nothing was recorded."""

    code = "INVALID_FENCE"
