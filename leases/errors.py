"""One error hierarchy for the lease system; every class carries a stable ``code``.

Every error any part of the package raises on purpose is defined here, so the HTTP layer,
the Python client and the command line map the same codes to the same classes
(:func:`by_code`). The sections follow the layer that raises them: the engine, the HTTP
API and its keys, the HTTP answers that name no lease condition (wrong secret, route or
method, a server bug), the Python HTTP client, the pod registry and dispatch, the contrib
handlers, the ``lease`` command and the embedded test server.
"""

from __future__ import annotations

from typing import Any


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
                 position: int | None = None, retry_after: float | None = None):
        self.resource = resource
        self.level = level
        self.scope = scope
        self.count = count
        self.cap = cap
        self.position = position
        self.retry_after: float = self.DEFAULT_RETRY_AFTER_S if retry_after is None else float(retry_after)
        where = f", queue position {position}" if position is not None else ""
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


# --- Fencing (the resource's side: leases.fencing) ---------------------------------------


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


# --- HTTP API and its keys -------------------------------------------------------------


class Unauthenticated(LeaseError):
    """No API key, a malformed or unknown one, or a revoked one (HTTP 401)."""

    code = "UNAUTHENTICATED"


class ApiKeyScopeGone(Unauthenticated):
    """A genuine key whose tenant (or bound project) no longer exists (HTTP 401).

    Such a key must not book counters any more: nobody administers that scope, so its
    holders would consume the global cap where no tenant admin can see them.
    """

    code = "API_KEY_SCOPE_GONE"


class ProjectForbidden(LeaseError):
    """A project-bound key asked for another project (HTTP 403)."""

    code = "PROJECT_FORBIDDEN"


class InvalidBody(InvalidLeaseRequest):
    """The request body is not the documented JSON object (HTTP 400); nothing was written."""

    code = "INVALID_BODY"


class BodyTooLarge(InvalidBody):
    """The request body exceeds the documented size limit (HTTP 400 on ``/api/v1/``, 413 on
    the pod-internal revocation endpoint); nothing of it was parsed."""

    code = "BODY_TOO_LARGE"


class ApiKeyNotFound(LeaseError):
    """No key with that prefix in that tenant (management pages and ``manage.py apikey``)."""

    code = "API_KEY_NOT_FOUND"


class InvalidApiKeyRequest(InvalidLeaseRequest):
    """Bad input to key management (name, tenant or project id); nothing was written."""

    code = "INVALID_API_KEY_REQUEST"


class UnknownTenant(InvalidApiKeyRequest):
    """Key management named a tenant that does not exist; nothing was written."""

    code = "UNKNOWN_TENANT"


class UnknownProject(InvalidApiKeyRequest):
    """Key management named a project the tenant does not have; nothing was written."""

    code = "UNKNOWN_PROJECT"


# --- HTTP answers that name no lease condition -----------------------------------------


class HttpProblem(LeaseError):
    """A problem answer that names no lease condition: one of the HTTP layer's own (the
    subclasses below: a wrong secret, route or method, a server bug) or a code this
    hierarchy does not know.

    ``status`` is the HTTP status (by default the one a server answers the class's
    condition with, :attr:`http_status`), ``problem_code`` the ``code`` member of the
    answer (None when it had none) and ``body`` the whole problem document. The Python
    client raises this class itself for all of them, with the answer's status and body.
    """

    code = "HTTP_PROBLEM"
    #: The HTTP status a server answers this condition with.
    http_status = 500

    def __init__(self, message: str, *, status: int | None = None, problem_code: str | None = None,
                 body: dict | None = None):
        super().__init__(message)
        self.status = self.http_status if status is None else status
        self.problem_code = problem_code
        self.body = body or {}


class Forbidden(HttpProblem):
    """A pod-internal request without the right shared secret (``X-Lease-Secret``)."""

    code = "FORBIDDEN"
    http_status = 403


class RouteNotFound(HttpProblem):
    """No such route on a pod's internal server."""

    code = "NOT_FOUND"
    http_status = 404


class MethodNotAllowed(HttpProblem):
    """The route does not take that HTTP method (the answer says which in ``Allow``)."""

    code = "METHOD_NOT_ALLOWED"
    http_status = 405


class InternalError(HttpProblem):
    """An unexpected failure of the server itself (a bug, not a lease condition)."""

    code = "INTERNAL_ERROR"
    http_status = 500


# --- Python HTTP client ----------------------------------------------------------------


class ApiKeyRejected(HttpProblem, Unauthenticated):
    """401: missing, wrong or revoked API key (the client's view of ``Unauthenticated``)."""

    code = "UNAUTHENTICATED"
    http_status = 401


class HttpCallFailed(LeaseError):
    """A pod-to-pod, CLI-to-pod or consumer-to-remote call got no usable answer: refused,
    timed out, unresolvable, a malformed URL or a non-JSON body (``leases.http_client``).

    ``reason`` says which, for logs and operator messages.
    """

    code = "HTTP_CALL_FAILED"

    def __init__(self, method: str, url: str, reason: Any):
        self.method = method
        self.url = url
        self.reason = reason
        super().__init__(f"{method} {url} failed: {reason}")


# --- Pod registry and revocation dispatch ----------------------------------------------


class PodLeaseError(LeaseError):
    """A pod-lease request that was refused because its input was bad; nothing was written."""

    code = "POD_LEASE_INVALID"


class LeaseStillHeld(LeaseError):
    """A revocation was posted for a token that is still a live holder."""

    code = "LEASE_STILL_HELD"


# --- Contrib handlers ------------------------------------------------------------------


class SessionError(LeaseError):
    """The remote session failed (connect, handshake or call)."""

    code = "SESSION_ERROR"


class SessionRevoked(LeaseLost):
    """The session's lease was lost; the session is closed, the next call opens a new one."""

    code = "SESSION_REVOKED"


class UnknownTool(InvalidLeaseRequest):
    """No tool configuration under that name."""

    code = "UNKNOWN_TOOL"


class JobAborted(LeaseError):
    """The job's lease was revoked while its poll loop ran (the handler aborted it)."""

    code = "JOB_ABORTED"


class JobTimeout(LeaseError):
    """The job produced no result within the caller's bound."""

    code = "JOB_TIMEOUT"


# --- The ``lease`` command -------------------------------------------------------------


class PodCallError(LeaseError):
    """No pod could carry out the request (none alive, none reachable, or refused)."""

    code = "POD_UNREACHABLE"


class PodNotFound(LeaseError, LookupError):
    """The pod is neither registered nor named by any holder."""

    code = "POD_NOT_FOUND"


class TenantNotFound(LeaseError, LookupError):
    """No Insights tenant, config document or holder has that tenant id."""

    code = "TENANT_NOT_FOUND"


class ResourceNotFound(LeaseError, LookupError):
    """No history, counter or holder names that resource."""

    code = "RESOURCE_NOT_FOUND"


class ProjectNotFound(LeaseError, LookupError):
    """The tenant has no such project (in Insights, its config documents or its holders)."""

    code = "PROJECT_NOT_FOUND"


# --- Settings read at import ---------------------------------------------------------


class InvalidSetting(LeaseError, ValueError):
    """A ``LEASES_*`` setting read once at import (the metric namespace) has a value that
    cannot be used; the module that reads it refuses to load."""

    code = "INVALID_SETTING"


# --- Embedded test server --------------------------------------------------------------


class EmbeddedServerError(LeaseError, RuntimeError):
    """The embedded SecantusDB server could not be started."""

    code = "EMBEDDED_SERVER_ERROR"


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
