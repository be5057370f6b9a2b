"""One error hierarchy for the lease system; every class carries a stable ``code``.

Every error any part of the package raises on purpose is defined in this package, so the HTTP layer,
the Python client and the command line map the same codes to the same classes
(:func:`by_code`). The sections follow the layer that raises them: the engine, the HTTP
API and its keys, the HTTP answers that name no lease condition (wrong secret, route or
method, a server bug), the Python HTTP client, the pod registry and dispatch, the contrib
handlers, the ``lease`` command and the embedded test server.

The classes live in three modules by who raises them (:mod:`.conditions`, :mod:`.http`,
:mod:`.operations`) and are all re-exported here, under this module's name: an error is
``leases.errors.LeaseBusy`` wherever it is defined (tracebacks, pickles, ``__module__``).
"""

from __future__ import annotations

from .conditions import (
    AuditEntryNotFound,
    HandlerAlreadyRegistered,
    HolderNotFound,
    InvalidDefinition,
    InvalidFence,
    InvalidLeaseRequest,
    LeaseBusy,
    LeaseError,
    LeaseExpired,
    LeaseLost,
    LeaseRetriesExhausted,
    LeaseUnavailable,
    PriorityNotAllowed,
    StaleFence,
    StaleLease,
    UnknownLease,
    UnknownLeaseType,
)
from .http import (
    ApiKeyNotFound,
    ApiKeyRejected,
    ApiKeyScopeGone,
    BodyTooLarge,
    Forbidden,
    HttpCallFailed,
    HttpProblem,
    InternalError,
    InvalidApiKeyRequest,
    InvalidBody,
    MethodNotAllowed,
    ProjectForbidden,
    RouteNotFound,
    Unauthenticated,
    UnknownProject,
    UnknownTenant,
)
from .operations import (
    EmbeddedServerError,
    InvalidSetting,
    JobAborted,
    JobTimeout,
    LeaseStillHeld,
    PodCallError,
    PodLeaseError,
    PodNotFound,
    ProjectNotFound,
    ResourceNotFound,
    SessionError,
    SessionRevoked,
    TenantNotFound,
    UnknownTool,
)

__all__ = ["ApiKeyNotFound", "ApiKeyRejected", "ApiKeyScopeGone", "AuditEntryNotFound", "BodyTooLarge", "EmbeddedServerError", "Forbidden", "HandlerAlreadyRegistered", "HolderNotFound", "HttpCallFailed", "HttpProblem", "InternalError", "InvalidApiKeyRequest", "InvalidBody", "InvalidDefinition", "InvalidFence", "InvalidLeaseRequest", "InvalidSetting", "JobAborted", "JobTimeout", "LeaseBusy", "LeaseError", "LeaseExpired", "LeaseLost", "LeaseRetriesExhausted", "LeaseStillHeld", "LeaseUnavailable", "MethodNotAllowed", "PodCallError", "PodLeaseError", "PodNotFound", "PriorityNotAllowed", "ProjectForbidden", "ProjectNotFound", "ResourceNotFound", "RouteNotFound", "SessionError", "SessionRevoked", "StaleFence", "StaleLease", "TenantNotFound", "Unauthenticated", "UnknownLease", "UnknownLeaseType", "UnknownProject", "UnknownTenant", "UnknownTool", "by_code"]

# One public identity per class, whichever module holds its source.
for _name in __all__[:-1]:
    globals()[_name].__module__ = __name__
del _name


def by_code(code: str) -> type[LeaseError] | None:
    """The class of this hierarchy whose ``code`` is ``code`` (None when none is).

    Where a subclass repeats its parent's code (``ApiKeyRejected``), the parent is the
    answer: the code names the condition, the subclass is a view of one layer.
    """
    found: type[LeaseError] | None = None
    pending: list[type[LeaseError]] = [LeaseError]
    while pending:
        cls = pending.pop(0)
        if cls.code == code and found is None:
            found = cls
        pending.extend(sub for sub in cls.__subclasses__() if sub.__module__ == __name__)
    return found
