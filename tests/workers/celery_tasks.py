"""Tasks a real Celery worker runs in tests/contrib/test_contrib_celery.py (``-I tests.workers.celery_tasks``).

Each task reports what it saw as its result (the test reads it from the Redis result
backend): the lease token, the holder's state in MongoDB while the body ran, the retries.
"""

from __future__ import annotations

import os
import time

from celery import shared_task

from leases.contrib.celery import leased
from leases.revocation import handlers
from leases.store import client as store

TYPE = "celerytest"


class CeleryTestHandler(handlers.LeaseHandler):
    type = TYPE

    def on_revoked(self, holder):  # a revocation needs no clean-up in these tasks
        return None


handlers.register_handler(CeleryTestHandler())


def _seen(task, lease) -> dict:
    holder = store.holders().find_one({"_id": lease.token}, {"state": 1, "pod": 1})
    return {"token": lease.token, "state": holder and holder["state"], "retries": task.request.retries,
            "pid": os.getpid(), "at": time.time()}


@shared_task(bind=True, name="celerytest.leased_echo")
@leased(TYPE, lease="ctask", tenant="tenant_id", project="project_id", user="user_id")
def leased_echo(self, tenant_id, project_id, user_id, *, lease):
    lease.check()
    return _seen(self, lease)


@shared_task(bind=True, name="celerytest.leased_boom")
@leased(TYPE, lease="ctask", tenant="tenant_id", project="project_id", user="user_id")
def leased_boom(self, tenant_id, project_id, user_id, *, lease):
    raise RuntimeError(f"boom {lease.token}")


@shared_task(bind=True, name="celerytest.leased_short")
@leased(TYPE, lease="ctask", tenant=lambda t, p, u: t, project=lambda t, p, u: p, user=lambda t, p, u: u,
        max_retries=2, countdown=0.2)
def leased_short(self, tenant_id, project_id, user_id, *, lease):
    return _seen(self, lease)


@shared_task(name="celerytest.plain")
def plain():
    return {"pid": os.getpid(), "at": time.time()}
