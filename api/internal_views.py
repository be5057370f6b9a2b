"""``POST /internal/lease/revoked``: another pod hands us a revocation of one of our leases.

Machine-to-machine with a shared secret (``X-Lease-Secret`` = ``LEASES_INTERNAL_SECRET``,
compared in constant time), hence ``csrf_exempt``: there is no browser session to ride on.
The view only parses and authenticates; ``leases.dispatch.accept_remote`` schedules the
local handler asynchronously and the answer is ``202`` at once.
"""

from __future__ import annotations

import hmac
import json
import logging

import pymongo.errors
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from leases import dispatch
from leases.errors import InvalidLeaseRequest, UnknownLeaseType

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"code": code, "message": message}, status=status)


def _authorized(request: HttpRequest) -> bool:
    presented = request.headers.get(dispatch.SECRET_HEADER, "")
    expected = settings.LEASES_INTERNAL_SECRET or ""
    # Both sides as bytes: compare_digest refuses non-ASCII str, and an empty configured
    # secret must never authorize an empty header.
    return bool(expected) and hmac.compare_digest(presented.encode(), expected.encode())


@csrf_exempt
@require_POST
def revoked(request: HttpRequest) -> JsonResponse:
    """Accept one revoked holder (``RevokedHolder.to_wire`` JSON) and run its handler here."""
    if not _authorized(request):
        return _error(403, "FORBIDDEN", "missing or wrong X-Lease-Secret")
    if len(request.body) > MAX_BODY_BYTES:
        return _error(413, "TOO_LARGE", "revocation body too large")
    try:
        data = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        return _error(400, InvalidLeaseRequest.code, "body is not JSON")
    try:
        holder = dispatch.accept_remote(data)
    except UnknownLeaseType as exc:
        return _error(404, exc.code, str(exc))
    except InvalidLeaseRequest as exc:
        return _error(400, exc.code, str(exc))
    except dispatch.LeaseStillHeld as exc:
        return _error(409, exc.code, str(exc))
    except pymongo.errors.PyMongoError:
        return _error(503, "LEASE_UNAVAILABLE", "lease store unreachable")
    return JsonResponse({"accepted": holder.token}, status=202)
