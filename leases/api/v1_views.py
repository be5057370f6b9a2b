"""``/api/v1/`` views: parse the request, call :mod:`leases.api.protocol`, answer JSON or a problem.

The views are ``csrf_exempt`` because they authenticate by bearer API key only and never
look at session cookies (``request.user`` is never read here): a cross-site form post
carries no key and is answered 401.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from leases import service
from leases.errors import InternalError, LeaseError, MethodNotAllowed

from . import bodies, keys, openapi, problems, protocol, tickets
from .models import ApiKey

log = logging.getLogger(__name__)

View = Callable[..., HttpResponse]


def _bearer(request: HttpRequest) -> str:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def api_view(methods: tuple[str, ...], *, authenticated: bool = True) -> Callable[[View], View]:
    """Method check (405 problem), bearer authentication (401), LeaseError → problem answer."""

    def decorate(view: View) -> View:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method not in methods:
                response = problems.problem(MethodNotAllowed.http_status, MethodNotAllowed.code,
                                            "Method not allowed", f"use {', '.join(methods)}")
                response["Allow"] = ", ".join(methods)
                return response
            try:
                if authenticated:
                    kwargs["key"] = keys.authenticate(_bearer(request))
                return view(request, *args, **kwargs)
            except LeaseError as error:
                return problems.from_error(error)
            except Exception:  # an answer must stay problem+json even for our own bugs
                log.exception("unhandled error in %s", view.__name__)
                return problems.problem(InternalError.http_status, InternalError.code, "Internal error",
                                        "unexpected server error")

        return wrapper

    return decorate


def _created(body: dict, status: int) -> JsonResponse:
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"
    return response


@api_view(("POST",))
def acquire(request: HttpRequest, *, key: ApiKey) -> HttpResponse:
    """POST /api/v1/leases → 201 Grant, 200 NoopGrant, 202 Ticket (still waiting), 429 busy,
    503 unavailable."""
    body = bodies.fields(bodies.read_object(request), bodies.ACQUIRE_FIELDS, required=("type", "projectId", "userId"))
    grant = protocol.acquire(
        key=key, type=body["type"], user_id=body["userId"], project_id=body["projectId"],
        lease=body.get("lease"), inline=body.get("inline"), holder_ref=body.get("holderRef") or "",
        pod_bound=body.get("podBound", False), proposed_interval=body.get("proposedIntervalSeconds"),
        wait_ms=body.get("waitMs"), priority=body.get("priority"),
    )
    if isinstance(grant, service.Ticket):
        return _waiting(tickets.answer(grant), 202)
    return _created(grant.to_json(), 200 if grant.noop else 201)


def _waiting(ticket: tickets.TicketAnswer, status: int) -> JsonResponse:
    response = _created(ticket.to_json(), status)
    response["Retry-After"] = str(ticket.retry_after)
    if status == 202:
        response["Location"] = ticket.location
    return response


@api_view(("GET", "DELETE"))
def ticket(request: HttpRequest, ticket_id: str, *, key: ApiKey) -> HttpResponse:
    """GET /api/v1/tickets/{id}[?waitMs=N] → 200 Ticket (still waiting) or 201 Grant (granted
    now or before; with ``waitMs``, the poll waits up to that long for the grant); DELETE →
    204 (abandoned or released), 200 ``alreadyReleased`` when it had ended."""
    if request.method == "DELETE":
        ended_before = tickets.abandon(key=key, ticket_id=ticket_id)
        if ended_before is None:
            response = HttpResponse(status=204)
            response["Cache-Control"] = "no-store"
            return response
        return _created(ended_before.to_json(), 200)
    polled = tickets.poll(key=key, ticket_id=ticket_id, wait_ms=bodies.query_integer(request, "waitMs", 0, bodies.MAX_WAIT_MS))
    if isinstance(polled, tickets.TicketAnswer):
        return _waiting(polled, 200)
    return _created(polled.to_json(), 201)


@api_view(("POST",))
def renew(request: HttpRequest, token: str, *, key: ApiKey) -> HttpResponse:
    """POST /api/v1/leases/{token}/renew → 200 Grant with the new deadline; 410 when gone."""
    body = bodies.fields(bodies.read_object(request, optional=True), bodies.RENEW_FIELDS)
    grant = protocol.renew(key=key, token=token, proposed_interval=body.get("proposedIntervalSeconds"))
    return _created(grant.to_json(), 200)


@api_view(("PUT",))
def payload(request: HttpRequest, token: str, *, key: ApiKey) -> HttpResponse:
    """PUT /api/v1/leases/{token}/payload → 200 Grant (the update is also a renewal)."""
    body = bodies.fields(bodies.read_object(request), bodies.PAYLOAD_FIELDS, required=("payload",))
    grant = protocol.renew(key=key, token=token, payload=body["payload"],
                           proposed_interval=body.get("proposedIntervalSeconds"))
    return _created(grant.to_json(), 200)


@api_view(("DELETE",))
def release(request: HttpRequest, token: str, *, key: ApiKey) -> HttpResponse:
    """DELETE /api/v1/leases/{token} → 200 ``released`` or ``alreadyReleased``."""
    return _created(protocol.release(key=key, token=token).to_json(), 200)


@api_view(("GET",), authenticated=False)
def openapi_document(request: HttpRequest) -> HttpResponse:
    """GET /api/v1/openapi.json: the OpenAPI 3.1 document of this API."""
    return JsonResponse(openapi.document(request.build_absolute_uri("/")), json_dumps_params={"indent": 1})
