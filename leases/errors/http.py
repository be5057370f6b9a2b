"""Errors of the HTTP side: the API and its keys, the HTTP answers that name no lease condition
(wrong secret, route or method, a server bug), the Python client's view and failed calls.
"""

from __future__ import annotations

from typing import Any

from .conditions import InvalidLeaseRequest, LeaseError

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
