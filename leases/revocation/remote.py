"""Operator revocations and sweeps through a live pod's internal admin API.

Only pods run revocation handlers (their code registers the types), so an operator process
(the ``lease`` CLI) asks a live pod to revoke or sweep: ``POST {endpoint}/internal/lease/admin/…``
with the shared secret (:data:`leases.revocation.dispatch.SECRET_HEADER`). The first pod
that answers does it; the answer is the pod's JSON report. Every call is bounded
(:mod:`leases.http_client`).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from .. import http_client
from ..conf import lease_settings
from ..errors import HolderNotFound, InvalidLeaseRequest, PodCallError, by_code
from ..pods.liveness import foreign_endpoints
from .dispatch import SECRET_HEADER

ADMIN_PATH = "/internal/lease/admin"
REVOKE_FORCE_HINT = "rerun with --force to revoke directly in MongoDB (no handler runs)"
# The pod answers after its round (bounded by upkeep.tasks.SWEEP_BUDGET_SECONDS) and the
# wait for its dispatches (admin_views.SWEEP_SETTLE_SECONDS); the call's bound is above both.
SWEEP_FORCE_HINT = "rerun with --force to sweep directly in MongoDB (no handler runs)"
ENDPOINT_LABEL = "(--endpoint)"


def pod_endpoints(endpoint: str | None = None) -> list[tuple[str, str]]:
    """``(pod, endpoint)`` pairs to try in turn: the given URL alone, else every live foreign pod.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable (no ``endpoint`` given).
    """
    if endpoint:
        return [(ENDPOINT_LABEL, endpoint.rstrip("/"))]
    return foreign_endpoints()


def call_admin(path: str, body: dict[str, Any], *, endpoint: str | None = None,
               timeout: float = http_client.OPERATOR_TIMEOUT_SECONDS,
               force_hint: str = REVOKE_FORCE_HINT) -> tuple[str, dict[str, Any]]:
    """POST ``body`` to the admin ``path`` of the first live pod that answers; returns (pod, answer).

    A pod that cannot be reached or answers 5xx is skipped for the next one; an answer that
    is about the request (404 for the holder, 400, 403) ends the call.

    Raises:
        HolderNotFound: the pod knows no such holder.
        InvalidLeaseRequest: the pod refused the request (the pod's own code when it is one
            of this hierarchy's ``InvalidLeaseRequest`` codes).
        PodCallError: no live pod, none reachable, or the pod refused the shared secret.
        pymongo.errors.PyMongoError: the store is unreachable (no ``endpoint`` given).
    """
    endpoints = pod_endpoints(endpoint)
    if not endpoints:
        raise PodCallError(f"no live pod is registered; {force_hint}")
    tried = []
    for pod, url in endpoints:
        try:
            reply = http_client.call_json("POST", url + ADMIN_PATH + path, body=body, timeout=timeout,
                                          headers={SECRET_HEADER: lease_settings.INTERNAL_SECRET})
        except http_client.HttpCallFailed as exc:
            tried.append(f"{pod} ({url}): {exc.reason}")
            continue
        answer = reply.body if isinstance(reply.body, dict) else {}
        if reply.ok:
            return pod, answer
        if reply.status == 404 and answer.get("code") == HolderNotFound.code:
            raise HolderNotFound(answer.get("message") or "no such holder")
        if reply.status == 400:
            raise _refusal(answer.get("code", InvalidLeaseRequest.code), answer.get("message", "bad request"))
        if reply.status == 403:
            raise PodCallError(f"pod {pod} ({url}) refused the shared secret: check LEASES_INTERNAL_SECRET")
        tried.append(f"{pod} ({url}): HTTP {reply.status}")
    raise PodCallError("no pod reachable (" + "; ".join(tried) + f"); {force_hint}")


def _refusal(code: str, message: str) -> InvalidLeaseRequest:
    """The pod's 400 as the error of its code (``InvalidLeaseRequest`` for a code we do not know)."""
    cls = by_code(code)
    if cls is None or not issubclass(cls, InvalidLeaseRequest):
        cls = InvalidLeaseRequest
    return cls(message)


def revoke(*, actor: str, token: str | None = None, pod: str | None = None, reason: str | None = None,
           endpoint: str | None = None) -> tuple[str, dict[str, Any]]:
    """Revoke one holder (``token``) or every holder of ``pod`` through a live pod, handlers run there.

    Returns the pod that did it and its answer (``revoked``, ``dispatchSettled``, …).

    Raises:
        HolderNotFound, InvalidLeaseRequest, PodCallError: as :func:`call_admin`.
        pymongo.errors.PyMongoError: the store is unreachable (no ``endpoint`` given).
    """
    if token is not None:
        path = f"/revoke/{urllib.parse.quote(token, safe='')}"
    else:
        path = f"/revoke-pod/{urllib.parse.quote(pod or '', safe='')}"
    body = {"actor": actor}
    if reason:
        body["reason"] = reason
    return call_admin(path, body, endpoint=endpoint)


def sweep(*, actor: str, endpoint: str | None = None) -> tuple[str, dict[str, Any]]:
    """One sweep (idle, dead pods, reconcile) run by a live pod with its handlers; (pod, report).

    Raises:
        InvalidLeaseRequest, PodCallError: as :func:`call_admin`.
        pymongo.errors.PyMongoError: the store is unreachable (no ``endpoint`` given).
    """
    return call_admin("/sweep", {"actor": actor}, endpoint=endpoint,
                      timeout=http_client.OPERATOR_SWEEP_TIMEOUT_SECONDS, force_hint=SWEEP_FORCE_HINT)
