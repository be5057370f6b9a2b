"""``@leased`` Celery tasks on a real worker (``--pool solo``) against Redis and the embedded server.

The worker uses Redis DB 13 as broker and result backend on a queue of this test run
alone, so another run's worker never takes these tasks.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from datetime import datetime, timedelta

import pytest
import redis
from celery import Celery

import leases
from leases import service
from leases.contrib import celery as leased_celery
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.errors import LeaseRetriesExhausted
from leases.revocation import handlers
from leases.store import client as store
from tests.helpers import PYTHON, REPO, child_env, wait_for
from tests.workers.celery_tasks import TYPE, CeleryTestHandler

REDIS_TEST_DB = 13
BROKER = f"redis://127.0.0.1:6379/{REDIS_TEST_DB}"


def put(text: str) -> None:
    config.put_document("_vance", "_tenant", document_path("ctask"), text)


@pytest.fixture
def handler():
    # The worker module registered its own instance on import; this one records here.
    yield handlers.register_handler(CeleryTestHandler(), replace=True)
    handlers.unregister_handler(TYPE)


@pytest.fixture(scope="module")
def queue() -> str:
    return f"leases-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def worker(queue, handler, settings):
    """One real worker process (solo pool: one task at a time, so a blocked task would
    block every other task of this worker)."""
    try:
        redis.Redis.from_url(BROKER).ping()
    except redis.RedisError as exc:  # pragma: no cover - the suite needs Redis (scripts/bootstrap.sh)
        pytest.fail(f"Redis at 127.0.0.1:6379 is required: {exc}")
    put("levels: {global: 1}\nwaitMs: 0\nttlSeconds: 30")
    env = child_env(CELERY_BROKER_URL=BROKER, CELERY_RESULT_BACKEND=BROKER, POD_ID=f"celery-{queue}",
                    LEASES_POD_AUTOSTART="0", LEASES_INTERNAL_SECRET=settings.LEASES_INTERNAL_SECRET,
                    LEASES_TICKET_POLL_SECONDS="1", DJANGO_LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [PYTHON, "-m", "celery", "-A", "config", "worker", "--pool=solo", "--loglevel=WARNING", "-Q", queue,
         "-I", "tests.workers.celery_tasks", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "-n", f"{queue}@%h"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    app = Celery("leases-test-client", broker=BROKER, backend=BROKER)
    app.conf.task_serializer = app.conf.result_serializer = "json"

    def send(name, *args, **kwargs):
        return app.send_task(name, args=args, kwargs=kwargs, queue=queue)

    try:
        try:
            send("celerytest.plain").get(timeout=60)
        except Exception:
            proc.terminate()
            raise AssertionError(f"worker did not start: {proc.communicate(timeout=10)[1][-3000:]}") from None
        yield send
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        app.close()


def gate_queue() -> list[str]:
    doc = store.counters().find_one({"_id": "ctask|global|*"}) or {}
    return [t["id"] for t in doc.get("queue") or ()]


def test_given_a_free_resource_when_a_leased_task_runs_then_its_body_holds_the_lease_and_it_is_released_after(worker):
    seen = worker("celerytest.leased_echo", "acme", "p1", "u1").get(timeout=30)
    assert seen["state"] == "HELD" and seen["retries"] == 0
    assert store.holders().find_one({"_id": seen["token"]}) is None
    assert store.counters().find_one({"_id": "ctask|global|*"})["count"] == 0


def test_given_a_body_that_raises_when_the_task_fails_then_the_lease_is_released(worker):
    result = worker("celerytest.leased_boom", "acme", "p1", "u1")
    with pytest.raises(Exception) as failed:
        result.get(timeout=30)
    token = str(failed.value).split("boom ")[-1].strip("'\" )")
    assert len(token) >= 16 and store.holders().find_one({"_id": token}) is None
    assert store.counters().find_one({"_id": "ctask|global|*"})["count"] == 0


def test_given_a_busy_resource_when_the_task_runs_then_it_retries_keeping_its_place_and_the_worker_runs_other_tasks(worker):
    holder = leases.acquire(leases.LeaseRequest(type=TYPE, lease="ctask", tenant_id="other", project_id="p",
                                                user_id="u"))
    try:
        waiting = worker("celerytest.leased_echo", "acme", "p1", "u1")
        assert wait_for(lambda: waiting.state == "RETRY", 20), waiting.state
        ticket = gate_queue()
        assert len(ticket) == 1  # its place in the queue, kept while it is not running
        # The solo worker is free: another task runs at once while the leased one waits.
        other = worker("celerytest.plain").get(timeout=10)
        assert waiting.state == "RETRY"
        time.sleep(2.5)  # more than one keep-alive retry later, the ticket is still the same one
        assert gate_queue() == ticket and waiting.state == "RETRY"
    finally:
        released_at = time.time()
        holder.release()
    seen = waiting.get(timeout=30)
    assert seen["token"] == ticket[0] and seen["state"] == "HELD" and seen["retries"] >= 2
    assert other["at"] < released_at <= seen["at"]
    assert store.holders().count_documents({}) == 0 and gate_queue() == []


def test_given_a_retrying_task_when_a_later_request_queues_behind_it_then_the_task_is_granted_first(worker):
    put("levels: {global: 1}\nwaitMs: 20000\nttlSeconds: 30")
    holder = leases.acquire(leases.LeaseRequest(type=TYPE, lease="ctask", tenant_id="other", project_id="p",
                                                user_id="u"))
    later: dict = {}

    def queue_behind():
        with leases.acquire(leases.LeaseRequest(type=TYPE, lease="ctask", tenant_id="acme", project_id="p1",
                                                user_id="u2")) as lease:
            later["at"] = time.time()
            later["token"] = lease.token

    try:
        task = worker("celerytest.leased_echo", "acme", "p1", "u1")
        assert wait_for(lambda: task.state == "RETRY" and len(gate_queue()) == 1, 20), task.state
        first = gate_queue()[0]
        behind = threading.Thread(target=queue_behind)
        behind.start()
        assert wait_for(lambda: len(gate_queue()) == 2, 10)
        assert gate_queue()[0] == first  # the retrying task is still ahead
    finally:
        holder.release()
    seen = task.get(timeout=30)
    behind.join(timeout=30)
    assert seen["token"] == first and later["token"] != first
    assert seen["at"] <= later["at"]  # granted in queue order, across the task's retries


def test_given_a_resource_that_stays_busy_when_the_retries_are_spent_then_the_task_fails_clearly_and_leaves_the_queue(worker):
    holder = leases.acquire(leases.LeaseRequest(type=TYPE, lease="ctask", tenant_id="other", project_id="p",
                                                user_id="u"))
    try:
        result = worker("celerytest.leased_short", "acme", "p1", "u1")
        with pytest.raises(Exception) as failed:
            result.get(timeout=30)
        assert "still busy after 2 retries" in str(failed.value)
        assert result.state == "FAILURE"
        assert gate_queue() == []  # the kept ticket was given up, not left at the head
        assert store.holders().count_documents({"state": "PENDING"}) == 0
    finally:
        holder.release()


def test_given_a_ticket_dropped_before_the_retry_when_the_task_retries_then_it_queues_again_from_the_back(
        handler, settings):
    settings.LEASES_TICKET_POLL_SECONDS = 1  # keep window 3 s
    put("levels: {global: 1}\nwaitMs: 0\nttlSeconds: 30")
    holder = leases.acquire(leases.LeaseRequest(type=TYPE, lease="ctask", tenant_id="other", project_id="p",
                                                user_id="u"))
    request = service.LeaseRequest(type=TYPE, lease="ctask", tenant_id="acme", project_id="p1", user_id="u1",
                                   wait_ms=0)
    try:
        first = leased_celery._acquire(request, None, keep_place=True)
        assert isinstance(first, service.Ticket) and gate_queue() == [first.id]
        time.sleep(3.3)  # a retry that comes back after the keep window
        again = leased_celery._acquire(request, first.id, keep_place=True)
        assert isinstance(again, service.Ticket) and again.id != first.id
        assert gate_queue() == [again.id]
    finally:
        holder.release()


def test_given_a_ticket_queued_by_another_worker_when_this_one_is_granted_then_the_lease_moves_to_this_pod(
        handler):
    from leases.pods.identity import self_pod_id

    put("levels: {global: 1}\nwaitMs: 0\nttlSeconds: 30")
    holder = leases.acquire(leases.LeaseRequest(type=TYPE, lease="ctask", tenant_id="other", project_id="p",
                                                user_id="u"))
    elsewhere = service.LeaseRequest(type=TYPE, lease="ctask", tenant_id="acme", project_id="p1", user_id="u1",
                                     wait_ms=0, pod="worker-that-queued")
    ticket = leased_celery._acquire(elsewhere, None, keep_place=True)
    assert isinstance(ticket, service.Ticket)
    assert store.holders().find_one({"_id": ticket.id})["pod"] == "worker-that-queued"
    holder.release()
    granted = leased_celery._acquire(elsewhere, ticket.id, keep_place=True)
    try:
        assert isinstance(granted, service.Lease) and granted.token == ticket.id
        assert store.holders().find_one({"_id": ticket.id})["pod"] == self_pod_id() == granted.request.pod
    finally:
        granted.release()


@pytest.mark.parametrize("kwargs,message", [
    (dict(tenant="nope", project="project_id", user="user_id"), "no argument 'nope'"),
    (dict(tenant="tenant_id", project="project_id", user=3), "must name an argument or be a callable"),
    (dict(tenant="tenant_id", project="project_id", user="user_id", max_retries=-1), "max_retries"),
])
def test_given_a_bad_decoration_then_it_is_refused_at_import(kwargs, message):
    with pytest.raises(TypeError, match=message):
        @leased_celery.leased(TYPE, lease="ctask", **kwargs)
        def body(self, tenant_id, project_id, user_id, *, lease):
            return None


def test_given_a_function_without_a_lease_parameter_then_it_is_refused():
    with pytest.raises(TypeError, match="'lease'"):
        @leased_celery.leased(TYPE, lease="ctask", tenant="t", project="t", user="t")
        def body(self, t):
            return None


@pytest.mark.parametrize("grant_in,expected", [(None, 2.0), (0.1, 0.5), (1.2, 1.2), (30.0, 2.0)])
def test_given_a_kept_ticket_then_its_retry_comes_at_the_estimate_within_half_a_second_and_one_poll(
        settings, grant_in, expected):
    settings.LEASES_TICKET_POLL_SECONDS = 2
    now = datetime(2026, 1, 1, 12, 0, 0)
    ticket = service.Ticket(id="t" * 24, resource="ctask", lease_name="ctask", level="global", position=1,
                            server_time=now, deadline=now + timedelta(seconds=6),
                            estimated_grant_at=None if grant_in is None else now + timedelta(seconds=grant_in))
    assert leased_celery.ticket_delay(ticket) == pytest.approx(expected)


def test_retries_exhausted_is_a_busy_error_that_rebuilds_from_its_message():
    error = LeaseRetriesExhausted(retries=3, resource="ctask", level="global", position=1)
    assert isinstance(error, leases.LeaseBusy) and error.code == "LEASE_RETRIES_EXHAUSTED"
    assert str(LeaseRetriesExhausted(*error.args)) == str(error)
