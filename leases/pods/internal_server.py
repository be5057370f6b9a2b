"""The internal HTTP endpoint of a pod without a web server (a Celery worker process).

Other pods POST revocations to ``/internal/lease/revoked`` and the operator CLI posts to
``/internal/lease/admin/…``; a worker serves exactly those routes
(:mod:`leases.api.pod_urls`) from a daemon thread, never the project's admin, Insights or
``/metrics``: a worker's port is reachable by every pod and should not widen what it exposes.
"""

from __future__ import annotations

import os
import socketserver
import threading
import urllib.parse
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponseBase

from leases.conf import lease_settings

POD_URLCONF = "leases.api.pod_urls"


class InternalOnlyHandler(WSGIHandler):
    """Django's WSGI handler with the settings' middleware, resolving only :data:`POD_URLCONF`.

    ``request.urlconf`` is honoured by URL resolution, ``APPEND_SLASH`` and the 404 page
    alike, so nothing of ``ROOT_URLCONF`` is reachable through this handler.
    """

    def get_response(self, request: HttpRequest) -> HttpResponseBase:
        request.urlconf = POD_URLCONF
        return super().get_response(request)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # access logs would drown the worker log
        pass


_server_lock = threading.Lock()
_server: Any = None
_server_pid: int | None = None


def serve_internal(bind: str | None = None) -> str:
    """Serve ``/internal/lease/…`` of this process from a daemon thread; return the endpoint URL.

    ``bind`` is ``host:port`` (port 0 = any free port); default: the host/port of
    ``LEASES_POD_ENDPOINT`` if set, else ``LEASES_WORKER_INTERNAL_BIND``. If that port is
    taken (prefork children share the parent's settings), a free port on the same host is
    used. Idempotent per process; a forked child starts its own server (the parent's thread
    did not survive the fork).

    Raises:
        OSError: no port could be bound.
    """
    global _server, _server_pid
    with _server_lock:
        if _server is not None and _server_pid == os.getpid():
            host, port = _server.server_address[:2]
            return f"http://{host}:{port}"
        s = lease_settings
        if bind is None:
            if s.POD_ENDPOINT:
                parsed = urllib.parse.urlsplit(s.POD_ENDPOINT)
                bind = f"{parsed.hostname}:{parsed.port or 80}"
            else:
                bind = s.WORKER_INTERNAL_BIND
        host, _, port_text = bind.rpartition(":")
        host = host or "127.0.0.1"
        app = InternalOnlyHandler()
        try:
            server = make_server(host, int(port_text or 0), app, server_class=_Server, handler_class=_QuietHandler)
        except OSError:
            server = make_server(host, 0, app, server_class=_Server, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="pod-internal-http",
                         daemon=True).start()
        _server, _server_pid = server, os.getpid()
        bound_host, bound_port = server.server_address[:2]
    if s.POD_ENDPOINT and int(port_text or 0) == bound_port:
        return s.POD_ENDPOINT.rstrip("/")
    host = bound_host.decode() if isinstance(bound_host, bytes) else bound_host
    return f"http://{host}:{bound_port}"
