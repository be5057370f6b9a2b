"""``POST /internal/lease/revoked``: another pod hands us a revocation of one of our leases.

Machine-to-machine with a shared secret (``X-Lease-Secret`` = ``LEASES_INTERNAL_SECRET``,
compared in constant time), hence ``csrf_exempt``: there is no browser session to ride on.
The view only parses and authenticates; ``leases.revocation.dispatch.accept_remote`` schedules the
local handler asynchronously and the answer is ``202`` at once.
"""

from __future__ import annotations

import json
import logging

import pymongo.errors
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from leases.api.internal_auth import authorized, error
from leases.errors import BodyTooLarge, Forbidden, InvalidLeaseRequest, LeaseUnavailable, UnknownLeaseType
from leases.revocation import dispatch

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024




@csrf_exempt
@require_POST
def revoked(request: HttpRequest) -> JsonResponse:
    """Accept one revoked holder (``RevokedHolder.to_wire`` JSON) and run its handler here."""
    if not authorized(request):
        return error(Forbidden.http_status, Forbidden.code, "missing or wrong X-Lease-Secret")
    if len(request.body) > MAX_BODY_BYTES:
        # 413 here (a peer pod's POST, not an API client's): the code is the API's.
        return error(413, BodyTooLarge.code, "revocation body too large")
    try:
        data = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        return error(400, InvalidLeaseRequest.code, "body is not JSON")
    try:
        holder = dispatch.accept_remote(data)
    except UnknownLeaseType as exc:
        return error(404, exc.code, str(exc))
    except InvalidLeaseRequest as exc:
        return error(400, exc.code, str(exc))
    except dispatch.LeaseStillHeld as exc:
        return error(409, exc.code, str(exc))
    except pymongo.errors.PyMongoError:
        return error(503, LeaseUnavailable.code, "lease store unreachable")
    return JsonResponse({"accepted": holder.token}, status=202)
