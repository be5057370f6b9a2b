"""Tasks a real prefork worker runs in tests/upkeep/test_tasks.py (``-I tests.workers.prefork_tasks``).

The handler of the ``preforktest`` type records in MongoDB (collection ``prefork_probe``)
which process ran it, so the test can tell that a revocation reached the very child that
holds the lease; ``hold_until_lost`` holds a lease in a pool child until it is lost.
"""

from __future__ import annotations

import os
import time

from celery import shared_task

import leases
from leases.pods.identity import self_pod_id
from leases.revocation import handlers
from leases.store import client as store

TYPE = "preforktest"


def probe():
    return store.db()["prefork_probe"]


class PreforkTestHandler(handlers.LeaseHandler):
    type = TYPE

    def on_revoked(self, holder):
        probe().insert_one({"kind": "handled", "token": holder.token, "pid": os.getpid(), "pod": self_pod_id(),
                            "reason": holder.reason})


handlers.register_handler(PreforkTestHandler())


@shared_task(name="preforktest.whoami")
def whoami():
    return {"pid": os.getpid(), "pod": self_pod_id()}


@shared_task(name="preforktest.hold_until_lost")
def hold_until_lost(tenant_id, seconds=60.0):
    lease = leases.acquire(leases.LeaseRequest(type=TYPE, lease=TYPE, tenant_id=tenant_id, project_id="p1",
                                               user_id="u1"))
    probe().insert_one({"kind": "holding", "token": lease.token, "pid": os.getpid(), "pod": self_pod_id()})
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            lease.check()
        except leases.LeaseLost:
            probe().insert_one({"kind": "lost", "token": lease.token, "pid": os.getpid()})
            return {"lost": True, "pid": os.getpid()}
        time.sleep(0.1)
    lease.release()
    return {"lost": False, "pid": os.getpid()}
