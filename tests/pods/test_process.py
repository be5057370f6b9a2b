"""This process's machinery: started on a web process's first request and in each worker process."""

from __future__ import annotations

import json
import subprocess
import textwrap

from leases.pods import process, renewer as pod_renewer
from leases.store import client as store
from tests.helpers import PYTHON, REPO, child_env


def stored(pod_id):
    return store.pods().find_one({"_id": pod_id})


def test_given_web_process_when_first_request_arrives_then_it_becomes_a_pod_at_the_request_host(settings, monkeypatch):
    settings.LEASES_POD_ENDPOINT = None
    settings.LEASES_POD_AUTOSTART = True
    monkeypatch.setattr(pod_renewer, "_renewer", None)
    monkeypatch.setattr(pod_renewer, "_renewer_pid", None)
    monkeypatch.setattr(pod_renewer.atexit, "register", lambda fn: fn)  # this test stops it itself
    process.on_request_started(environ={"HTTP_HOST": "10.0.0.7:8000", "wsgi.url_scheme": "http"})
    renewer = pod_renewer.current_renewer()
    try:
        assert renewer is not None
        doc = stored(renewer.pod_id)
        assert doc["endpoint"] == "http://10.0.0.7:8000" and doc["leaseId"] == renewer.lease.lease_id
        process.on_request_started(environ={"HTTP_HOST": "elsewhere:1"})  # idempotent per process
        assert pod_renewer.current_renewer() is renewer
    finally:
        renewer.shutdown()
    assert stored(renewer.pod_id)["stopped"] is True


# A fresh process: after django.setup() nothing of ours runs; its first request starts the
# invalidation subscription, and (with autostart off, as here) no pod.
FRESH_WEB_PROCESS = textwrap.dedent("""
    import json, threading
    import django
    django.setup()
    from django.test import Client
    from leases.definitions import invalidation
    from leases.pods import renewer as pod_renewer

    def ours():
        return sorted(t.name for t in threading.enumerate() if t.name.startswith(("lease-", "pod-")))

    at_setup = ours()
    Client().get("/no-such-page")
    print(json.dumps({"atSetup": at_setup, "afterRequest": ours(), "listening": invalidation.wait_listening(10),
                      "pod": pod_renewer.current_renewer() is not None}))
""")


def test_given_a_fresh_process_then_app_start_runs_no_thread_and_the_first_request_starts_the_subscription():
    result = subprocess.run([PYTHON, "-c", FRESH_WEB_PROCESS], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env=child_env(LEASES_POD_AUTOSTART="0"))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["atSetup"] == []
    assert seen["afterRequest"] == ["lease-config-invalidation"]
    assert seen["listening"] is True and seen["pod"] is False
