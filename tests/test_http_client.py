"""leases.http_client: one JSON client for pod-to-pod, CLI-to-pod and consumer calls, always bounded."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from leases import http_client
from leases.store.embedded import free_port


class _Handler(BaseHTTPRequestHandler):
    """``/json/<status>`` answers JSON with that status; ``/text`` answers plain text."""

    seen: list[dict] = []

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        _Handler.seen.append({"method": self.command, "path": self.path, "type": self.headers.get("Content-Type"),
                              "secret": self.headers.get("X-Lease-Secret"), "body": raw})
        if self.path == "/text":
            payload, status, kind = b"<html>not json</html>", 200, "text/html"
        elif self.path == "/empty":
            payload, status, kind = b"", 204, "application/json"
        else:
            status = int(self.path.rsplit("/", 1)[1])
            payload, kind = json.dumps({"code": f"S{status}", "echo": raw.decode() or None}).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("X-Answer", "yes")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_given_a_json_body_then_it_is_sent_as_json_and_the_2xx_answer_comes_back_parsed(server):
    answer = http_client.call_json("POST", server + "/json/202", body={"token": "t"}, timeout=5,
                                   headers={"X-Lease-Secret": "s3"})
    assert answer.ok and answer.status == 202 and answer.headers["X-Answer"] == "yes"
    assert answer.body == {"code": "S202", "echo": '{"token": "t"}'}
    (seen,) = _Handler.seen
    assert seen["type"] == "application/json" and seen["secret"] == "s3" and json.loads(seen["body"]) == {"token": "t"}


def test_given_no_body_then_none_is_sent_and_an_empty_answer_is_none(server):
    answer = http_client.call_json("DELETE", server + "/empty", timeout=5)
    assert answer.status == 204 and answer.body is None and _Handler.seen[0]["body"] == b""


@pytest.mark.parametrize("status", [400, 403, 404, 409, 503])
def test_given_an_error_status_then_it_is_an_answer_with_its_json_body_not_an_exception(server, status):
    answer = http_client.call_json("POST", server + f"/json/{status}", body={}, timeout=5)
    assert not answer.ok and answer.status == status and answer.body["code"] == f"S{status}"


def test_given_a_body_that_is_not_json_then_the_call_failed(server):
    with pytest.raises(http_client.HttpCallFailed) as failed:
        http_client.call_json("GET", server + "/text", timeout=5)
    assert "not JSON" in str(failed.value.reason)


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}/json/200", "not a url", "ftp://127.0.0.1/x"])
def test_given_nobody_listening_or_a_malformed_url_then_the_call_failed(url):
    with pytest.raises(http_client.HttpCallFailed):
        http_client.call_json("POST", url.format(port=free_port()), body={}, timeout=2)


def test_given_a_peer_that_accepts_but_never_answers_then_the_call_ends_within_its_timeout():
    # A listening socket nobody accepts from: the connection succeeds, no answer ever comes.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        started = time.monotonic()
        with pytest.raises(http_client.HttpCallFailed):
            http_client.call_json("POST", f"http://127.0.0.1:{silent.getsockname()[1]}/x", body={}, timeout=0.5)
        assert time.monotonic() - started < 0.5 + 2.0
    finally:
        silent.close()
