"""Internal admin API (``/internal/lease/admin/…``): operator revocations executed by a pod.

The ``lease`` CLI reads MongoDB directly but revokes through a pod, because only pods run
handlers and know the pod routing (§9). Machine-to-machine: the shared secret in
``X-Lease-Secret`` (``LEASES_INTERNAL_SECRET``, constant-time comparison) is the only
credential — a tenant UI session cookie authorizes nothing here — hence ``csrf_exempt``.
Views only parse and authenticate; :mod:`leases.operations` acts.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pymongo.errors
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from api.internal_auth import authorized, error
from leases import operations
from leases.dispatch import SECRET_HEADER, get_dispatcher
from leases.errors import HolderNotFound, InvalidLeaseRequest
from leases.identity import self_pod_id

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024
# How long the answer waits for the dispatched handlers, so the CLI can say whether they
# finished; the revocation itself is complete before this wait starts.
SETTLE_SECONDS = 5.0




def _body(request: HttpRequest) -> dict[str, Any]:
    if len(request.body) > MAX_BODY_BYTES:
        raise InvalidLeaseRequest("body too large")
    if not request.body:
        return {}
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise InvalidLeaseRequest("body is not JSON") from None
    if not isinstance(data, dict):
        raise InvalidLeaseRequest("body must be a JSON object")
    return data


def _actor(data: dict[str, Any]) -> str:
    actor = data.get("actor", "unknown")
    if not isinstance(actor, str):
        raise InvalidLeaseRequest("actor must be a string")
    return f"internal-admin:{actor}"


def _answer(revoked: list, status: int = 200) -> JsonResponse:
    settled = get_dispatcher().drain(timeout=SETTLE_SECONDS) if revoked else True
    return JsonResponse({
        "pod": self_pod_id(),
        "revoked": [h.to_wire() for h in revoked],
        "handlersDispatched": True,
        "dispatchSettled": settled,
    }, status=status)


def _guarded(request: HttpRequest, act) -> JsonResponse:
    if not authorized(request):
        return error(403, "FORBIDDEN", f"missing or wrong {SECRET_HEADER}")
    try:
        return _answer(act(_body(request)))
    except HolderNotFound as exc:
        return error(404, exc.code, str(exc))
    except InvalidLeaseRequest as exc:
        return error(400, exc.code, str(exc))
    except pymongo.errors.PyMongoError:
        return error(503, "LEASE_UNAVAILABLE", "lease store unreachable")


@csrf_exempt
@require_POST
def revoke_token(request: HttpRequest, token: str) -> JsonResponse:
    """Revoke one holder (any tenant) and dispatch its handler from this pod."""
    return _guarded(request, lambda data: [operations.revoke_holder(
        token, acting_user=_actor(data), reason=data.get("reason") or "revoked by operator (CLI)")])


@csrf_exempt
@require_POST
def revoke_pod(request: HttpRequest, pod: str) -> JsonResponse:
    """Revoke every holder of ``pod`` and dispatch their handlers from this pod."""
    return _guarded(request, lambda data: operations.revoke_pod(
        pod, acting_user=_actor(data), reason=data.get("reason") or "pod revoked by operator (CLI)"))
