"""Child process: a pod whose own code registers the lease type ``podonly``.

Usage: python -m tests.workers.handler_pod [--hold]

The type exists only in this worker's code, so no other process (the ``lease`` CLI, the
test process) has its handler. The pod serves the Django app on a free port
(``/internal/lease/…``), renews its pod lease, and its handler records every revocation
it runs in the ``test_handler_runs`` collection (pod, token, payload): the cross-process
evidence of where a handler ran. With ``--hold`` it also acquires one ``podonly`` lease,
not pod-bound, with a payload. Prints one JSON line ``{"pod", "endpoint", "token"}``.
"""

import json
import sys
import time

import django

django.setup()

from leases import LeaseRequest, acquire  # noqa: E402
from leases.pods import internal_server, process  # noqa: E402
from leases.pods.identity import self_pod_id  # noqa: E402
from leases.revocation import handlers  # noqa: E402
from leases.store import client as store  # noqa: E402

TYPE = "podonly"
RUNS = "test_handler_runs"


class PodOnlyHandler(handlers.LeaseHandler):
    """Records where and with which payload it ran (a real consumer would DELETE a session)."""

    type = TYPE

    def on_revoked(self, holder):
        store.db()[RUNS].insert_one({"pod": self_pod_id(), "token": holder.token, "payload": holder.payload,
                                     "reason": holder.reason})


def main() -> None:
    handlers.register_handler(PodOnlyHandler())
    endpoint = internal_server.serve_internal("127.0.0.1:0")
    process.start(endpoint)
    token = None
    if "--hold" in sys.argv:
        lease = acquire(LeaseRequest(type=TYPE, lease="podonly", tenant_id="t1", project_id="p1", user_id="u1",
                                     pod_bound=False))
        lease.update_payload({"sessionId": "s-42", "endpoint": "http://127.0.0.1:9/mcp"})
        token = lease.token
    print(json.dumps({"pod": self_pod_id(), "endpoint": endpoint, "token": token}), flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
