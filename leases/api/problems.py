"""``application/problem+json`` answers (RFC 9457) carrying the error's stable ``code``.

Every error the API answers is a :class:`leases.errors.LeaseError`; its class decides the
HTTP status, its ``code`` goes into the body next to ``type``, ``title``, ``status`` and
``detail``. A busy answer adds the diagnosis (resource, level, scope, count, cap) and a
``Retry-After`` header.
"""

from __future__ import annotations

import math
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views import defaults

from leases.errors import (
    InvalidLeaseRequest,
    LeaseBusy,
    LeaseError,
    LeaseExpired,
    LeaseLost,
    LeaseUnavailable,
    PriorityNotAllowed,
    ProjectForbidden,
    StaleLease,
    Unauthenticated,
)

CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "urn:vance:lease:problem:"
# Clients retry a busy acquire after this many seconds (plus their own jitter): the
# server already waited up to the bounded waitMs for the slot before answering 429.
BUSY_RETRY_AFTER_SECONDS = 1

# Most specific first: StaleLease/LeaseExpired are LeaseLost, every bad input is an
# InvalidLeaseRequest (UnknownLeaseType, InvalidDefinition, InvalidBody, ...).
_STATUS: list[tuple[type[LeaseError], int, str]] = [
    (Unauthenticated, 401, "Unauthenticated"),
    (ProjectForbidden, 403, "Project not allowed for this key"),
    (LeaseBusy, 429, "Lease busy"),
    (StaleLease, 410, "Unknown lease"),
    (LeaseExpired, 410, "Lease expired"),
    (LeaseLost, 410, "Lease lost"),
    (LeaseUnavailable, 503, "Lease store unavailable"),
    (PriorityNotAllowed, 403, "Priority class not allowed for this tenant"),
    (InvalidLeaseRequest, 400, "Invalid request"),
]


def status_of(error: LeaseError) -> tuple[int, str]:
    """HTTP status and title for ``error`` (500 for an unmapped LeaseError)."""
    for cls, status, title in _STATUS:
        if isinstance(error, cls):
            return status, title
    return 500, "Lease error"


def problem(status: int, code: str, title: str, detail: str, **extra: Any) -> JsonResponse:
    """A problem+json response with ``code`` and any ``extra`` members."""
    body = {"type": TYPE_BASE + code, "title": title, "status": status, "code": code, "detail": detail, **extra}
    return JsonResponse(body, status=status, content_type=CONTENT_TYPE)


def from_error(error: LeaseError) -> JsonResponse:
    """The problem answer for ``error``, with the headers its status needs."""
    status, title = status_of(error)
    extra: dict[str, Any] = {}
    retry_after = BUSY_RETRY_AFTER_SECONDS
    if isinstance(error, LeaseBusy):
        if error.retry_after is not None:
            # The queue's estimate of when this request's turn would have come.
            retry_after = max(BUSY_RETRY_AFTER_SECONDS, math.ceil(error.retry_after))
        extra = {"resource": error.resource, "level": error.level, "scope": error.scope,
                 "count": error.count, "cap": error.cap, "retryAfterSeconds": retry_after}
        if error.queue_full:
            extra["queueFull"] = True
    reason = getattr(error, "reason", None)
    if isinstance(error, LeaseExpired) and reason:
        extra["reason"] = reason
    response = problem(status, error.code, title, str(error), **extra)
    if isinstance(error, LeaseBusy):
        response["Retry-After"] = str(retry_after)
    if isinstance(error, Unauthenticated):
        response["WWW-Authenticate"] = 'Bearer realm="leases"'
    return response


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """The project's ``handler400``: a request Django refuses before any view runs (a
    ``Host`` header that is empty or not allowed, a malformed cookie) is answered as
    problem+json on a route of the HTTP API (``leases.api.v1_urls``, wherever it is
    mounted), as its clients expect of every error; elsewhere as Django's own page.

    Set it in the root URLconf: ``handler400 = "leases.api.problems.bad_request"``.
    """
    try:
        api = resolve(request.path_info).app_name == "api_v1"
    except Resolver404:
        api = False
    if api:
        return problem(400, InvalidLeaseRequest.code, "Invalid request",
                       "refused before it reached the API: a header Django does not accept (Host)")
    return defaults.bad_request(request, exception if exception is not None else Exception())
