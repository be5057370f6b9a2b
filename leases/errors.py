"""One error hierarchy for the lease system; every class carries a stable ``code``."""

from __future__ import annotations


class LeaseError(Exception):
    """Base of every lease error; ``code`` is the stable, machine-readable name."""

    code = "LEASE_ERROR"


class LeaseBusy(LeaseError):
    """A level stayed full for the whole wait; carries the diagnosis.

    ``position`` is the place the request had in the resource's queue when it gave up
    (None when it did not queue); ``retry_after`` a suggested delay in seconds, if known.
    """

    code = "LEASE_BUSY"

    def __init__(self, *, resource: str, level: str, scope: str, count: int | None, cap: int,
                 position: int | None = None, retry_after: float | None = None):
        self.resource = resource
        self.level = level
        self.scope = scope
        self.count = count
        self.cap = cap
        self.position = position
        self.retry_after = retry_after
        where = f", queue position {position}" if position is not None else ""
        super().__init__(
            f"lease busy: resource {resource!r} level {level} scope {scope!r} holds {count}/{cap}{where}"
        )


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
        self.reason = reason  # idle, pod, revoke, release, deadline (past expiresAt, not reaped yet)
        super().__init__(message)


class InvalidLeaseRequest(LeaseError, ValueError):
    """The caller passed bad input; nothing was written."""

    code = "INVALID_REQUEST"


class UnknownLeaseType(InvalidLeaseRequest):
    """The request names a ``type`` without a registered handler."""

    code = "UNKNOWN_LEASE_TYPE"


class PriorityNotAllowed(InvalidLeaseRequest):
    """The request names a priority class its tenant may not use (never silently downgraded)."""

    code = "PRIORITY_NOT_ALLOWED"


class InvalidDefinition(InvalidLeaseRequest):
    """An inline definition or a config document that was refused on write."""

    code = "INVALID_DEFINITION"


class HolderNotFound(LeaseError, LookupError):
    """No holder with that token (in the caller's tenant); also said for other tenants' tokens."""

    code = "HOLDER_NOT_FOUND"


class AuditEntryNotFound(LeaseError, LookupError):
    """No audit record with that id (in the caller's tenant); also said for other tenants' ids."""

    code = "AUDIT_ENTRY_NOT_FOUND"
