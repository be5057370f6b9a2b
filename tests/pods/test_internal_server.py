"""A worker's internal HTTP server serves ``/internal/lease/…`` and nothing else of the project.

In-process: the server this test process starts. Real process: a Celery worker (itself a
pod) serves its registered endpoint, and that port answers the admin, Insights and
``/metrics`` with 404 while the pod-to-pod and operator routes answer as they do on a web pod.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from leases.pods import internal_server
from leases.pods.identity import self_pod_id
from leases.store import client as store
from tests.helpers import celery_worker, wait_for

SECRET = "test-internal-secret"


def request(url: str, *, method: str = "GET", body: dict | None = None, secret: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"X-Lease-Secret": secret} if secret else {})}
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers),
                                    timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def assert_only_internal_routes(endpoint: str, pod_id: str) -> None:
    for path in ("/admin/", "/admin/login/", "/metrics", "/t/t1/insights/leases", "/api/v1/leases", "/"):
        status, body = request(endpoint + path)
        assert status == 404 and json.loads(body)["code"] == "NOT_FOUND", (path, status, body[-2000:])
    # Still served: the pod-to-pod route (secret checked, method enforced) ...
    status, body = request(endpoint + "/internal/lease/revoked", method="POST", body={"token": "x"}, secret="wrong")
    assert status == 403 and json.loads(body)["code"] == "FORBIDDEN"
    assert request(endpoint + "/internal/lease/revoked")[0] == 405
    status, body = request(endpoint + "/internal/lease/revoked", method="POST", body={"token": {"$gt": ""}},
                           secret=SECRET)
    assert status == 400 and json.loads(body)["code"] == "INVALID_REQUEST"
    # ... and the operator route, which really sweeps on that pod.
    status, body = request(endpoint + "/internal/lease/admin/sweep", method="POST", body={}, secret=SECRET)
    assert status == 200 and json.loads(body)["pod"] == pod_id, body


def test_given_the_internal_server_of_this_process_then_only_the_internal_routes_answer():
    endpoint = internal_server.serve_internal("127.0.0.1:0")
    assert internal_server.serve_internal("127.0.0.1:0") == endpoint  # once per process
    assert_only_internal_routes(endpoint, self_pod_id())


def test_given_a_celery_worker_pod_then_its_internal_port_serves_only_internal_routes(settings):
    # DEBUG off as in production: Django's technical 404 page would stand in for the JSON answer.
    with celery_worker("worker-http-pod", pool="solo", DJANGO_DEBUG="0") as worker:
        doc = wait_for(lambda: store.pods().find_one({"_id": "worker-http-pod", "stopped": False,
                                                       "endpoint": {"$ne": ""}}), 60)
        assert doc, worker.diagnosis()
        assert_only_internal_routes(doc["endpoint"], "worker-http-pod")
