"""Resource leases for Django: fair, crash-safe sharing of scarce resources.

Public consumer contract::

    import leases

    with leases.acquire(leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme",
                                            project_id="docs", user_id="alice")) as lease:
        lease.update_payload({"jobId": job_id})
        while not done:
            lease.check()   # every usage step: raises LeaseLost once reaped or revoked
"""

from .errors import (
    InvalidDefinition,
    InvalidLeaseRequest,
    LeaseBusy,
    LeaseError,
    LeaseLost,
    LeaseUnavailable,
    PriorityNotAllowed,
    UnknownLeaseType,
)
from .service import NOOP, Lease, LeaseRequest, acquire


__all__ = [
    "acquire",
    "Lease",
    "LeaseRequest",
    "NOOP",
    "LeaseError",
    "LeaseBusy",
    "LeaseUnavailable",
    "LeaseLost",
    "InvalidLeaseRequest",
    "UnknownLeaseType",
    "InvalidDefinition",
    "PriorityNotAllowed",
]
