"""leases.revocation.remote: the operator's calls to a pod's admin API, over real sockets.

A real pod is exercised by test_cli.py (revoke, revoke-pod, sweep, a wrong secret). Here a
small real HTTP server on a free port plays a pod that answers a chosen status, so every
branch of the answer handling is shown: the next pod after a 5xx or a refused connection,
the pod's own error class for a 400, 404 for the holder, 403 for the secret.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from leases.errors import HolderNotFound, InvalidBody, InvalidLeaseRequest, PodCallError
from leases.revocation import remote
from leases.revocation.dispatch import SECRET_HEADER
from leases.store.embedded import free_port


@contextmanager
def pod_answering(status: int, body: dict):
    """An HTTP server that answers every POST with ``status`` and ``body``; yields (url, requests seen)."""
    seen: list[tuple[str, dict, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server hook's name
            length = int(self.headers.get("Content-Length") or 0)
            seen.append((self.path, json.loads(self.rfile.read(length) or b"{}"), self.headers.get(SECRET_HEADER)))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_given_no_live_pod_then_the_call_fails_with_the_force_hint():
    with pytest.raises(PodCallError, match="no live pod is registered; rerun with --force to sweep"):
        remote.sweep(actor="cli:test")


def test_given_a_pod_that_answers_then_the_revoke_goes_to_the_admin_path_with_the_secret(settings):
    settings.LEASES_INTERNAL_SECRET = "s3cret"
    with pod_answering(200, {"pod": "p1", "revoked": []}) as (url, seen):
        pod, answer = remote.revoke(actor="cli:test", token="-Ab_", reason="typo", endpoint=url + "/")

    assert pod == remote.ENDPOINT_LABEL and answer == {"pod": "p1", "revoked": []}
    assert seen == [("/internal/lease/admin/revoke/-Ab_", {"actor": "cli:test", "reason": "typo"}, "s3cret")]


def test_given_a_400_with_a_known_code_then_the_pods_own_error_class_is_raised():
    with pod_answering(400, {"code": "INVALID_BODY", "message": "body is not JSON"}) as (url, _):
        with pytest.raises(InvalidBody, match="body is not JSON"):
            remote.revoke(actor="cli:test", pod="pod-x", endpoint=url)


def test_given_a_400_with_an_unknown_code_then_it_is_an_invalid_request():
    with pod_answering(400, {"code": "NO_SUCH_CODE"}) as (url, _):
        with pytest.raises(InvalidLeaseRequest, match="bad request") as raised:
            remote.revoke(actor="cli:test", pod="pod-x", endpoint=url)
    assert type(raised.value) is InvalidLeaseRequest


def test_given_a_404_for_the_holder_then_holder_not_found():
    with pod_answering(404, {"code": "HOLDER_NOT_FOUND", "message": "no holder T"}) as (url, _):
        with pytest.raises(HolderNotFound, match="no holder T"):
            remote.revoke(actor="cli:test", token="T" * 32, endpoint=url)


def test_given_a_403_then_the_shared_secret_is_named():
    with pod_answering(403, {"code": "FORBIDDEN"}) as (url, _):
        with pytest.raises(PodCallError, match="refused the shared secret: check LEASES_INTERNAL_SECRET"):
            remote.sweep(actor="cli:test", endpoint=url)


@pytest.mark.parametrize("status", [500, 503])
def test_given_a_pod_that_fails_then_the_error_lists_what_was_tried(status):
    with pod_answering(status, {}) as (url, _):
        with pytest.raises(PodCallError, match=rf"no pod reachable \(\(--endpoint\) \({url}\): HTTP {status}\)"):
            remote.sweep(actor="cli:test", endpoint=url)


def test_given_nothing_listening_then_the_error_says_why_and_suggests_force():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PodCallError, match=r"no pod reachable .*; rerun with --force to revoke") as raised:
        remote.revoke(actor="cli:test", token="T" * 32, endpoint=url)
    assert url in str(raised.value)
