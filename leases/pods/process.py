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


def on_request_started(sender: Any = None, environ: dict[str, Any] | None = None, **_: Any) -> None:
    """``request_started`` receiver: a web process starts its machinery on its first request.

    The invalidation subscription starts in every serving process; the pod only with
    ``LEASES_POD_AUTOSTART``. Without ``LEASES_POD_ENDPOINT`` the pod's endpoint is taken
    from that request's host, so a plain ``runserver`` is reachable by the other pods
    without extra configuration. Never fails the request.
    """
    try:
        invalidation.start()
    except Exception:  # a request never fails because Redis is unreachable
        log.exception("could not start the config invalidation subscription of this web process")
    if not lease_settings.POD_AUTOSTART or pod_renewer.current_renewer() is not None:
        return
    endpoint = lease_settings.POD_ENDPOINT or ""
    if not endpoint and environ:
        host = environ.get("HTTP_HOST") or f"{environ.get('SERVER_NAME', '127.0.0.1')}:{environ.get('SERVER_PORT', '80')}"
        endpoint = f"{environ.get('wsgi.url_scheme', 'http')}://{host}"
    try:
        pod_renewer.start_pod(endpoint)
    except Exception:  # never fail a request because the pod registry is unreachable
        log.exception("could not start the pod lease of this web process")
