"""Resource leases for Django: fair, crash-safe sharing of scarce resources.

Public consumer contract::

    import leases

    with leases.acquire(leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme",
                                            project_id="docs", user_id="alice")) as lease:
        lease.update_payload({"jobId": job_id})
        while not done:
            lease.check()   # every usage step: raises LeaseLost once reaped or revoked

    async with leases.aacquire(request) as lease:   # asyncio: the same, on pymongo's async client
        await lease.acheck()
"""

from .aio import ANOOP, AsyncLease, aacquire
from .errors import (
    InvalidDefinition,
    InvalidLeaseRequest,
    LeaseBusy,
    LeaseError,
    LeaseLost,
    LeaseUnavailable,
    PriorityNotAllowed,
    UnknownLease,
    UnknownLeaseType,
)
from .service import NOOP, Lease, LeaseRequest, acquire

__all__ = [
    "acquire",
    "aacquire",
    "AsyncLease",
    "ANOOP",
    "Lease",
    "LeaseRequest",
    "NOOP",
    "LeaseError",
    "LeaseBusy",
    "LeaseUnavailable",
    "LeaseLost",
    "InvalidLeaseRequest",
    "UnknownLeaseType",
    "UnknownLease",
    "InvalidDefinition",
    "PriorityNotAllowed",
]
