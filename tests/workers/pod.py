"""Child process: a pod that serves /internal/lease/ and holds two leases.

Usage: python -m tests.workers.pod <remote-url>

Serves /internal/lease/ on LEASES_POD_ENDPOINT, renews its pod lease, then holds a ``tex``
lease (pod-bound; a job poll loop that never finishes) and a ``browser`` session (not
pod-bound) opened on the demo remote server. Prints one JSON line with its tokens, then
``ABORTED <token>`` when the job loop is aborted by its handler.
"""

import json
import sys
import threading
import time

import django

django.setup()

from leases.contrib import jobs, sessions  # noqa: E402
from leases.pods import internal_server, process, renewer as pod_renewer  # noqa: E402


def main() -> None:
    remote = sys.argv[1].rstrip("/")
    endpoint = internal_server.serve_internal()
    renewer = process.start(endpoint)
    import urllib.request

    def http(method, url):
        req = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=5) as response:
            return json.loads(response.read())

    started = threading.Event()
    tex_token = {}

    def job_loop():
        original = jobs.tracker.register

        def register(token):
            tex_token["token"] = token
            started.set()
            return original(token)

        jobs.tracker.register = register
        try:
            jobs.run_job(submit=lambda: http("POST", remote + "/jobs")["jobId"],
                         poll=lambda job_id: None, tenant_id="t1", project_id=pod_renewer.current_renewer().pod_id, user_id="u1",
                         # One check() at the start, then the loop sleeps on its abort event: a
                         # short interval would let a check() between the reap and the
                         # handler's POST see the lease gone (LeaseExpired) before the abort.
                         poll_interval=600, timeout=3600)
        except jobs.JobAborted:
            print(f"ABORTED {tex_token.get('token')}", flush=True)
        except Exception as exc:  # noqa: BLE001 - report to the test
            print(f"JOBERROR {exc.__class__.__name__} {exc}", flush=True)

    threading.Thread(target=job_loop, daemon=True).start()
    started.wait(10)
    client = sessions.SessionClient("browser-tool", tenant_id="t1", project_id=renewer.pod_id, user_id=renewer.pod_id)
    client.call("tools/call", {"name": "open"})
    session = sessions.pool.get(client.key)
    print(json.dumps({"pod": renewer.pod_id, "endpoint": endpoint, "tex": tex_token.get("token"),
                      "browser": session.token, "sessionId": session.session_id}), flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
