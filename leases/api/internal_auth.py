"""The shared-secret check and error answer of the pod-internal endpoints."""

from __future__ import annotations

import hmac

from django.http import HttpRequest, JsonResponse

from leases.conf import lease_settings
from leases.errors import InternalError, RouteNotFound
from leases.revocation.dispatch import SECRET_HEADER


def error(status: int, code: str, message: str) -> JsonResponse:
    """A JSON error answer ``{"code", "message"}``."""
    return JsonResponse({"code": code, "message": message}, status=status)


def not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """The 404 answer of a pod's internal server: no such internal route."""
    return error(RouteNotFound.http_status, RouteNotFound.code, "no such internal route")


def server_error(request: HttpRequest) -> JsonResponse:
    """The 500 answer of a pod's internal server."""
    return error(InternalError.http_status, InternalError.code, "internal error")


def authorized(request: HttpRequest) -> bool:
    """True when the request carries ``LEASES_INTERNAL_SECRET`` in ``X-Lease-Secret``."""
    presented = request.headers.get(SECRET_HEADER, "")
    expected = lease_settings.INTERNAL_SECRET or ""
    # Bytes on both sides: compare_digest refuses non-ASCII str; an unset secret never
    # authorizes (not even an empty header). Constant time against the secret.
    return bool(expected) and hmac.compare_digest(presented.encode(), expected.encode())
