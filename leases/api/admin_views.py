"""Internal admin API (``/internal/lease/admin/…``): operator revocations and sweeps run by a pod.

The ``lease`` CLI reads MongoDB directly but revokes and sweeps through a pod, because only
pods hold the handler registry (types their code registers) and know the pod routing. Machine-to-machine: the shared secret in
``X-Lease-Secret`` (``LEASES_INTERNAL_SECRET``, constant-time comparison) is the only
credential — a tenant UI session cookie authorizes nothing here — hence ``csrf_exempt``.
Views only parse and authenticate; :mod:`leases.ops.actions` acts.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pymongo.errors
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from leases.api.internal_auth import authorized, error
from leases.errors import Forbidden, HolderNotFound, InvalidLeaseRequest, LeaseUnavailable
from leases.ops import actions
from leases.pods.identity import self_pod_id
from leases.revocation import dispatch
from leases.revocation.dispatch import SECRET_HEADER, get_dispatcher
from leases.upkeep import tasks

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024
# How long the answer waits for the dispatched handlers, so the CLI can say whether they
# finished; the revocation itself is complete before this wait starts.
SETTLE_SECONDS = 5.0
# The sweep's answer waits longer: a dispatch may offer a revocation to a few peer pods,
# each POST bounded (dispatch.MAX_PEER_OFFERS x http_client.PEER_TIMEOUT_SECONDS).
SWEEP_SETTLE_SECONDS = 12.0




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


def _answer(holders: list, settled: list[tuple[Any, dispatch.Outcome]], status: int = 200) -> JsonResponse:
    # Settled from this request's own dispatches, not from everything the pod has pending;
    # a holder whose dispatch was not seen counts as not settled.
    outcomes = {h.token: o for h, o in settled}
    revoked = [outcome_wire(h, outcomes.get(h.token, dispatch.Outcome(dispatch.PENDING))) for h in holders]
    return JsonResponse({
        "pod": self_pod_id(),
        "revoked": revoked,
        "handlersDispatched": True,
        "dispatchSettled": all(h["outcome"] != dispatch.PENDING for h in revoked),
        "unhandled": [h["token"] for h in revoked if h["outcome"] in (dispatch.NO_HANDLER, dispatch.FAILED)],
    }, status=status)


def _guarded(request: HttpRequest, act) -> JsonResponse:
    if not authorized(request):
        return error(Forbidden.http_status, Forbidden.code, f"missing or wrong {SECRET_HEADER}")
    dispatcher = get_dispatcher()
    try:
        data = _body(request)
        with dispatcher.collecting() as collected:
            holders = act(data)
        return _answer(holders, dispatcher.settle(collected, timeout=SETTLE_SECONDS))
    except HolderNotFound as exc:
        return error(404, exc.code, str(exc))
    except InvalidLeaseRequest as exc:
        return error(400, exc.code, str(exc))
    except pymongo.errors.PyMongoError:
        return error(503, LeaseUnavailable.code, "lease store unreachable")


@csrf_exempt
@require_POST
def revoke_token(request: HttpRequest, token: str) -> JsonResponse:
    """Revoke one holder (any tenant) and dispatch its handler from this pod."""
    return _guarded(request, lambda data: [actions.revoke_holder(
        token, acting_user=_actor(data), reason=data.get("reason") or "revoked by operator (CLI)")])


@csrf_exempt
@require_POST
def revoke_pod(request: HttpRequest, pod: str) -> JsonResponse:
    """Revoke every holder of ``pod`` and dispatch their handlers from this pod."""
    return _guarded(request, lambda data: actions.revoke_pod(
        pod, acting_user=_actor(data), reason=data.get("reason") or "pod revoked by operator (CLI)"))


def outcome_wire(holder, outcome: dispatch.Outcome) -> dict[str, Any]:
    """One reaped holder of a sweep with what its dispatch did (``outcome``, ``ranOn``)."""
    return {**holder.to_wire(), "outcome": outcome.path, "ranOn": outcome.ran_on,
            "handlerRan": outcome.handler_ran}


@csrf_exempt
@require_POST
def sweep(request: HttpRequest) -> JsonResponse:
    """Run one operator sweep (idle, dead pods, reconcile) here, with this pod's handlers.

    The answer lists every holder the round reaped with its dispatch outcome, so the CLI
    can say where each handler ran, and which ran nowhere.
    """
    if not authorized(request):
        return error(Forbidden.http_status, Forbidden.code, f"missing or wrong {SECRET_HEADER}")
    try:
        actor = _actor(_body(request))
    except InvalidLeaseRequest as exc:
        return error(400, exc.code, str(exc))
    dispatcher = get_dispatcher()
    try:
        with dispatcher.collecting() as collected:
            result = tasks.sweep()
    except pymongo.errors.PyMongoError:
        # Holders reaped before the outage are still dispatched; only the report is lost.
        return error(503, LeaseUnavailable.code, "lease store unreachable")
    settled = dispatcher.settle(collected, timeout=SWEEP_SETTLE_SECONDS)
    holders = [outcome_wire(h, o) for h, o in settled]
    log.info("operator sweep by %s: %d done, %d holder(s) dispatched", actor, result["done"], len(holders))
    return JsonResponse({
        "pod": self_pod_id(), **result, "holders": holders,
        "dispatchSettled": all(h["outcome"] != dispatch.PENDING for h in holders),
        "unhandled": [h["token"] for h in holders if h["outcome"] in (dispatch.NO_HANDLER, dispatch.FAILED)],
    })
