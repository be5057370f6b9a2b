"""This process's machinery: started on a web process's first request and in each worker process."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

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


def test_given_an_asgi_process_when_first_request_arrives_then_its_endpoint_comes_from_the_scope():
    scope = {"type": "http", "scheme": "http", "server": ("127.0.0.1", 8002),
             "headers": [(b"host", b"10.0.0.8:8002"), (b"accept", b"*/*")]}
    assert process.request_endpoint(scope=scope) == "http://10.0.0.8:8002"
    assert process.request_endpoint(scope={**scope, "headers": []}) == "http://127.0.0.1:8002"
    assert process.request_endpoint(scope={**scope, "scheme": "https"}) == "https://10.0.0.8:8002"
    # uvicorn on a Unix socket: no address to give; alive, unreachable for dispatch.
    assert process.request_endpoint(scope={"type": "http", "server": ("/run/app.sock", None), "headers": []}) == ""
    assert process.request_endpoint(environ={"HTTP_HOST": "h:1", "wsgi.url_scheme": "https"}) == "https://h:1"
    assert process.request_endpoint() == ""


def test_given_an_asgi_request_when_it_starts_the_pod_then_the_pod_is_registered_at_the_scope_host(settings,
                                                                                                     monkeypatch):
    settings.LEASES_POD_ENDPOINT = None
    settings.LEASES_POD_AUTOSTART = True
    monkeypatch.setattr(pod_renewer, "_renewer", None)
    monkeypatch.setattr(pod_renewer, "_renewer_pid", None)
    monkeypatch.setattr(pod_renewer.atexit, "register", lambda fn: fn)  # this test stops it itself
    # What Django's ASGIHandler sends: scope, no environ.
    process.on_request_started(scope={"type": "http", "scheme": "http", "server": ("127.0.0.1", 8002),
                                      "headers": [(b"host", b"127.0.0.1:8002")]})
    renewer = pod_renewer.current_renewer()
    try:
        assert renewer is not None and stored(renewer.pod_id)["endpoint"] == "http://127.0.0.1:8002"
    finally:
        renewer.shutdown()


# A script: acquires with the default pod (its own), holds until told, checks, releases.
SCRIPT = textwrap.dedent("""
    import json, sys
    import django
    django.setup()
    import leases
    from leases.pods.identity import self_pod_id

    lease = leases.acquire(leases.LeaseRequest(type="tex", lease="scripted", tenant_id="acme", project_id="p1",
                                               user_id="u1"))
    print(json.dumps({"token": lease.token, "pod": self_pod_id()}), flush=True)
    sys.stdin.readline()
    lease.check()
    lease.release()
    print(json.dumps({"checked": True}), flush=True)
""")


def _script(env_extra: dict[str, str]) -> tuple[subprocess.Popen, dict]:
    child = subprocess.Popen([PYTHON, "-c", SCRIPT], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=child_env(LEASES_POD_INTERVAL_MIN="1", LEASES_POD_INTERVAL_SECONDS="1",
                                           LEASES_POD_EXPIRY_FACTOR="2", DJANGO_LOG_LEVEL="WARNING", **env_extra))
    line = child.stdout.readline()
    assert line.startswith("{"), child.communicate(timeout=30)[1][-3000:]
    return child, json.loads(line)


def test_given_a_script_holding_a_lease_when_sweeps_run_elsewhere_then_it_is_not_reaped_until_the_process_dies():
    from leases.pods.liveness import liveness
    from leases.upkeep import sweeps
    from tests.helpers import define, wait_for

    define("scripted", "levels: {global: 1}\nttlSeconds: 600")
    child, held = _script({})  # LEASES_POD_AUTOSTART as a host has it: on
    try:
        assert stored(held["pod"])["endpoint"] == ""  # a pod now, one nobody can call
        # Sweeps of another process (this one) for longer than two of the script's pod deadlines.
        for _ in range(6):
            sweeps.reap_dead_pods()
            assert store.holders().find_one({"_id": held["token"]}) is not None, "the script's lease was reaped"
            time.sleep(0.75)
        child.stdin.write("\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0 and json.loads(out.strip().splitlines()[-1]) == {"checked": True}, err[-3000:]
        assert stored(held["pod"])["stopped"] is True  # marked stopped at exit
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # A script killed while it holds: its pod dies within interval x factor, and only then is it reaped.
    child, held = _script({})
    child.kill()
    child.wait()
    assert wait_for(lambda: not liveness.is_alive(held["pod"]), timeout=20, step=0.2)
    assert sweeps.reap_dead_pods()[0] == 1
    assert store.holders().find_one({"_id": held["token"]}) is None
