"""Celery worker wiring under the default prefork pool: real worker processes, real Redis.

A prefork worker (``--pool prefork --concurrency 2``) forks its children after it set up;
each child becomes a pod of its own (``POD_ID-<pid>``, its own internal endpoint, its own
pod lease renewal) on ``worker_process_init``, and the parent, which runs no task, is not a
pod at all. Sweeps sent to the worker's queue run in a child; a revocation of a lease a
child holds reaches that very child's handler; a child killed with SIGKILL is reaped like
any dead pod. The worker uses Redis DB 13 and a queue of its own.
"""

from __future__ import annotations

import os
import re
import signal

import pytest
from celery import Celery

from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.ops import actions
from leases.pods.liveness import liveness
from leases.store import client as store
from tests.helpers import CELERY_TEST_REDIS_DB, celery_worker, wait_for
from tests.workers.prefork_tasks import TYPE, PreforkTestHandler, probe

BROKER = f"redis://127.0.0.1:6379/{CELERY_TEST_REDIS_DB}"
POD = "prefork-pod"
POD_ENV = {"LEASES_POD_INTERVAL_SECONDS": "1", "LEASES_POD_INTERVAL_MIN": "1", "LEASES_POD_EXPIRY_FACTOR": "2",
           "CELERY_RESULT_BACKEND": BROKER}


@pytest.fixture
def app():
    client = Celery("prefork-test", broker=BROKER, backend=BROKER)
    yield client
    client.close()


@pytest.fixture
def handler():
    from leases.revocation import handlers

    # The worker module registered its own instance on import; this one records here.
    registered = handlers.register_handler(PreforkTestHandler(), replace=True)
    config.put_document("_vance", "_tenant", document_path(TYPE), "ttlSeconds: 600\nlevels: {global: 10}")
    yield registered
    handlers.unregister_handler(TYPE)


@pytest.fixture
def prefork_worker(handler):
    with celery_worker(POD, pool="prefork", concurrency=2, extra_args=("-I", "tests.workers.prefork_tasks"),
                       **POD_ENV) as worker:
        yield worker


def child_pods():
    """Alive pods of the worker's children, by id."""
    return {d["_id"]: d for d in store.pods().find({"_id": {"$regex": f"^{POD}-[0-9]+$"}})
            if liveness.is_alive(d["_id"])}


def send(app, worker, name, *args, **kwargs):
    return app.send_task(name, args=args, kwargs=kwargs, queue=worker.queue)


def test_given_a_prefork_worker_then_each_child_is_a_pod_with_its_own_endpoint_and_the_parent_is_none(app, prefork_worker):
    pods = wait_for(lambda: (found := child_pods()) and len(found) == 2 and found, 60)
    assert pods, prefork_worker.diagnosis()
    assert len({d["endpoint"] for d in pods.values()}) == 2
    assert store.pods().find_one({"_id": POD}) is None  # the parent forks; it is no pod
    # A task runs in one of those children, under that child's pod id.
    seen = send(app, prefork_worker, "preforktest.whoami").get(timeout=30)
    assert seen["pod"] == f"{POD}-{seen['pid']}" and seen["pod"] in pods
    assert seen["pid"] != prefork_worker.process.pid


def test_given_a_prefork_worker_when_a_sweep_task_runs_then_expired_and_dead_pod_holders_are_reaped(app, prefork_worker):
    import leases

    assert wait_for(lambda: len(child_pods()) == 2, 60), prefork_worker.diagnosis()
    # given: a holder whose TTL passed (server time) ...
    idle = leases.acquire(leases.LeaseRequest(type=TYPE, lease=TYPE, tenant_id="t-idle", project_id="p1", user_id="u1"))
    store.holders().update_one({"_id": idle.token}, {"$set": {"expiresAt": store.server_now().replace(year=2000)}})
    # ... and a holder of a child that is killed with SIGKILL while it holds the lease
    holding = send(app, prefork_worker, "preforktest.hold_until_lost", "t-dead", 600)
    held = wait_for(lambda: probe().find_one({"kind": "holding"}), 30)
    assert held, prefork_worker.diagnosis()
    assert store.holders().find_one({"_id": held["token"]})["pod"] == held["pod"]
    os.kill(held["pid"], signal.SIGKILL)
    assert wait_for(lambda: not liveness.is_alive(held["pod"]), 15), "the killed child's pod never died"
    # when: a sweep is sent to the worker (it runs in a child: the parent runs no task)
    assert wait_for(lambda: len(child_pods()) == 2, 60), prefork_worker.diagnosis()  # the pool replaced it
    send(app, prefork_worker, "leases.tasks.sweep")
    # then: both holders are gone and their slots returned
    assert wait_for(lambda: store.holders().count_documents({"_id": {"$in": [idle.token, held["token"]]}}) == 0, 30), \
        prefork_worker.diagnosis()
    assert store.tombstones().find_one({"_id": idle.token})["reason"] == "idle"
    assert store.tombstones().find_one({"_id": held["token"]})["reason"] == "pod"
    assert store.counters().find_one({"_id": f"{TYPE}|global|*"})["count"] == 0
    holding.forget()


def test_given_a_lease_held_in_a_pool_child_when_revoked_then_that_childs_handler_runs_and_the_task_sees_it_lost(
        app, prefork_worker):
    assert wait_for(lambda: len(child_pods()) == 2, 60), prefork_worker.diagnosis()
    result = send(app, prefork_worker, "preforktest.hold_until_lost", "t-rev", 60)
    held = wait_for(lambda: probe().find_one({"kind": "holding"}), 30)
    assert held, prefork_worker.diagnosis()
    # when: an operator (this process, another pod) revokes it
    actions.revoke_holder(held["token"], acting_user="ops", reason="prefork test")
    # then: the revocation was POSTed to the holding child, whose handler ran there
    handled = wait_for(lambda: probe().find_one({"kind": "handled", "token": held["token"]}), 30)
    assert handled, prefork_worker.diagnosis()
    assert (handled["pid"], handled["pod"]) == (held["pid"], held["pod"])
    assert result.get(timeout=30) == {"lost": True, "pid": held["pid"]}
    assert re.fullmatch(rf"{POD}-\d+", handled["pod"])
