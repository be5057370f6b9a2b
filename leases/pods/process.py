"""This process's lease machinery, started once per process where it survives a fork.

A process that serves — a web process, a Celery worker process that runs tasks — needs
three things of its own: its pod lease kept renewed (:mod:`leases.pods.renewer`), the
invalidation subscription that lets its definition cache serve (:mod:`leases.definitions.invalidation`),
and, without a web server, an internal endpoint (:mod:`leases.pods.internal_server`). All three
are threads, and a thread does not survive ``fork``: they are started in the process that
uses them, never in a parent that is about to fork (Celery's prefork pool: each child
starts its own on ``worker_process_init``, see :mod:`leases.upkeep.tasks`).
"""

from __future__ import annotations

import logging
from typing import Any

from leases.conf import lease_settings

from ..definitions import invalidation
from . import internal_server, renewer as pod_renewer

log = logging.getLogger(__name__)


def start(endpoint: str | None = None) -> pod_renewer.PodRenewer:
    """Start this process's pod (at ``endpoint``) and its invalidation subscription (idempotent).

    Raises:
        pymongo.errors.PyMongoError: the first pod registration could not reach the store.
    """
    invalidation.start()
    return pod_renewer.start_pod(endpoint)


def start_worker() -> str:
    """Make this worker process a pod with an internal endpoint of its own; returns the endpoint.

    Raises:
        OSError: no port could be bound for the internal endpoint.
        pymongo.errors.PyMongoError: the first pod registration could not reach the store.
    """
    endpoint = internal_server.serve_internal()
    renewer = start(endpoint)
    log.info("worker pod %s registered at %s", renewer.pod_id, endpoint)
    return endpoint


def stop() -> None:
    """Graceful shutdown of this process's pod (marks it stopped, so it is dead at once)."""
    pod_renewer.stop_pod()


def request_endpoint(environ: dict[str, Any] | None = None, scope: dict[str, Any] | None = None) -> str:
    """The URL other pods reach this web process at, from the request that started it.

    WSGI's ``environ`` (``HTTP_HOST``, else ``SERVER_NAME:SERVER_PORT``) or ASGI's ``scope``
    (its ``host`` header, else ``server``); ``""`` when neither tells (a Unix socket): the
    pod is then alive but unreachable for revocation dispatch.
    """
    if environ:
        host = environ.get("HTTP_HOST") or f"{environ.get('SERVER_NAME', '127.0.0.1')}:{environ.get('SERVER_PORT', '80')}"
        return f"{environ.get('wsgi.url_scheme', 'http')}://{host}"
    if scope and scope.get("type") in ("http", "websocket"):
        scheme = {"ws": "http", "wss": "https"}.get(scope.get("scheme") or "http", scope.get("scheme") or "http")
        headers = dict(scope.get("headers") or ())
        host = headers.get(b"host", b"").decode("latin-1")
        if not host:
            server = scope.get("server")
            if not server or server[1] is None:  # no server address, or a Unix socket
                return ""
            host = f"{server[0]}:{server[1]}"
        return f"{scheme}://{host}"
    return ""


def on_request_started(sender: Any = None, environ: dict[str, Any] | None = None,
                       scope: dict[str, Any] | None = None, **_: Any) -> None:
    """``request_started`` receiver: a web process starts its machinery on its first request.

    The invalidation subscription starts in every serving process; the pod only with
    ``LEASES_POD_AUTOSTART``. Without ``LEASES_POD_ENDPOINT`` the pod's endpoint is taken
    from that request (WSGI's ``environ``, ASGI's ``scope``), so a plain ``runserver`` or
    ``uvicorn`` is reachable by the other pods without extra configuration. Never fails the
    request.
    """
    try:
        invalidation.start()
    except Exception:  # a request never fails because Redis is unreachable
        log.exception("could not start the config invalidation subscription of this web process")
    if not lease_settings.POD_AUTOSTART or pod_renewer.current_renewer() is not None:
        return
    endpoint = lease_settings.POD_ENDPOINT or request_endpoint(environ, scope)
    try:
        pod_renewer.start_pod(endpoint)
    except Exception:  # never fail a request because the pod registry is unreachable
        log.exception("could not start the pod lease of this web process")


def ensure_pod() -> None:
    """Make this process a pod before it acquires with the default pod (``pod=None``).

    A lease names the pod whose death ends it, and a pod that never registered counts as
    dead: a script, ``manage.py shell`` or a notebook that acquires would see its lease reaped
    by the next sweep elsewhere while it still uses it. So any process that acquires for
    itself registers on its first acquire (with ``LEASES_POD_AUTOSTART``; without it the
    host starts its pods itself), at ``LEASES_POD_ENDPOINT`` or with no endpoint at all:
    alive for reaping, unreachable for revocation dispatch. Its renewer marks it stopped at
    exit. Costs nothing once the pod runs; never fails the acquire (an unreachable store is
    retried by the renewer, and the acquire itself will say so).
    """
    if not lease_settings.POD_AUTOSTART or pod_renewer.current_renewer() is not None:
        return
    try:
        pod_renewer.start_pod()
    except Exception:  # the acquire decides; the renewer retries the registration
        log.exception("could not start the pod lease of this process")
