"""Every process of the main job reaches one scrape: real web pod, Celery prefork worker and beat.

The processes are the dev stack's own (``config.devstack.process_specs`` on the environment
``config.devstack.stack_environment`` gives every process), on this test's database and a
private Redis as broker, so nothing else on the machine takes their tasks. The sweep that
reaps runs in a pool child because beat sent it; the ``@leased`` task's grant is counted
in another pool child; the scrape is a GET of the web pod's ``/metrics``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

import leases
from config import devstack
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.store import client as store
from leases.store.embedded import free_port
from leases.telemetry.metrics import PREFIX
from tests.helpers import REPO, child_env, private_redis, quiet_handler_fixture, wait_for

handler = quiet_handler_fixture("mpidle")
TASK_RESOURCE = "mp-task"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One GET of ``url``: every sample by (name, sorted labels)."""
    answer = requests.get(url, timeout=10)
    answer.raise_for_status()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


@pytest.fixture
def stack(settings):
    """The dev stack's web-1, worker and beat, on this test's database and a private Redis."""
    var = Path(tempfile.mkdtemp(prefix="lease-metrics-stack-"))
    port = free_port()
    with private_redis() as (redis_url, _):
        env = {**devstack.stack_environment(var),
               **child_env(CELERY_BROKER_URL=redis_url, CELERY_RESULT_BACKEND=redis_url, LEASES_REAP_INTERVAL="1",
                           LEASES_INTERNAL_SECRET=settings.LEASES_INTERNAL_SECRET, DJANGO_LOG_LEVEL="WARNING")}
        extra_args = {"worker": ["-I", "tests.workers.celery_tasks", "--without-gossip", "--without-mingle",
                                 "--without-heartbeat"],
                      "beat": ["--max-interval", "1"]}
        procs: dict[str, subprocess.Popen] = {}
        logs = {}
        try:
            for name, command, extra in devstack.process_specs(port, var):
                if name not in ("web-1", "worker", "beat"):
                    continue
                logs[name] = var / f"{name}.log"
                with open(logs[name], "wb") as log:
                    procs[name] = subprocess.Popen([*command, *extra_args.get(name, [])], cwd=REPO,
                                                   env={**env, **extra}, stdout=log, stderr=subprocess.STDOUT)

            def diagnosis() -> str:
                return "\n".join(f"--- {name} ({'running' if p.poll() is None else p.returncode}):\n"
                                 f"{logs[name].read_text(errors='replace')[-2500:]}" for name, p in procs.items())

            yield {"url": f"http://127.0.0.1:{port}", "redis": redis_url, "diagnosis": diagnosis}
        finally:
            for process in procs.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in procs.values():
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
            shutil.rmtree(var, ignore_errors=True)


def test_given_the_main_jobs_processes_then_a_beat_sweeps_reap_and_a_leased_tasks_grant_are_in_one_web_scrape(stack):
    config.put_document("_vance", "_tenant", document_path("ctask"), f"resource: {TASK_RESOURCE}\nlevels: {{global: 5}}")
    config.put_document("_vance", "_tenant", document_path("mpidle"), "resource: mp-idle\nttlSeconds: 600\nlevels: {global: 5}")
    # given: a holder whose TTL passed (server time), on a resource nobody acquires again,
    # so only a sweep can reap it
    idle = leases.acquire(leases.LeaseRequest(type="mpidle", lease="mpidle", tenant_id="t-idle", project_id="p1",
                                              user_id="u1"))
    store.holders().update_one({"_id": idle.token}, {"$set": {"expiresAt": store.server_now().replace(year=2000)}})
    metrics_url = f"{stack['url']}/metrics"
    assert wait_for(lambda: _answers(metrics_url), 60, step=0.5), stack["diagnosis"]()
    # when: beat's sweep (every second) runs in a worker child and reaps it ...
    assert wait_for(lambda: store.holders().find_one({"_id": idle.token}) is None, 60, step=0.2), stack["diagnosis"]()
    # a reap deletes the holder first, returns its slots, then writes the tombstone
    tombstone = wait_for(lambda: store.tombstones().find_one({"_id": idle.token}), 10, step=0.2)
    assert tombstone and tombstone["reason"] == "idle", stack["diagnosis"]()
    # ... and a @leased task is granted its lease in a worker child
    app = Celery("metrics-stack-test", broker=stack["redis"], backend=stack["redis"])
    try:
        seen = app.send_task("celerytest.leased_echo", args=("acme", "p1", "u1")).get(timeout=60)
    finally:
        app.close()
    assert seen["state"] == "HELD"
    # then: one scrape of the web pod has both, counted in processes that serve no HTTP
    reap = (f"{PREFIX}reap_total", (("reason", "idle"),))
    grant = (f"{PREFIX}acquire_total", (("outcome", "success"), ("resource", TASK_RESOURCE)))
    samples = wait_for(lambda: (found := scrape(metrics_url)).get(reap) and found.get(grant) and found, 10, step=0.5)
    assert samples, f"{sorted(k for k in scrape(metrics_url) if k[0].startswith(PREFIX))}\n{stack['diagnosis']()}"
    assert samples[reap] >= 1 and samples[grant] == 1


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


WAIT_THEN_DIE = """
import django
django.setup()
from leases.telemetry import metrics
metrics.WAITING.labels(resource="mp-gauge").inc()
metrics.REAP.labels(reason="idle").inc()
"""


def test_given_a_process_that_died_with_a_request_waiting_then_its_wait_leaves_the_scrape_and_its_counts_stay(
        tmp_path, monkeypatch):
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from leases.telemetry import multiprocess as multiprocess_metrics

    def collect() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(tmp_path))
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples}

    # given: a process of the host counted a reap and had a request waiting, then ended
    # without its shutdown hook (SIGKILL)
    child = subprocess.run([sys.executable, "-c", WAIT_THEN_DIE], cwd=REPO, capture_output=True, text=True,
                           env=child_env(PROMETHEUS_MULTIPROC_DIR=str(tmp_path), DJANGO_LOG_LEVEL="WARNING"), timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    waiting = (f"{PREFIX}waiting", (("resource", "mp-gauge"),))
    reaped = (f"{PREFIX}reap_total", (("reason", "idle"),))
    # then: the host's queue length is one series (not one per pid), the waiting request included
    assert collect()[waiting] == 1 and collect()[reaped] == 1
    # when: the next process that starts (a replacement pool child) looks for dead ones
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert multiprocess_metrics.forget_dead_processes() == [child_pid(tmp_path)]
    # then: the dead process waits for nothing any more; what it counted stays counted
    assert waiting not in collect() and collect()[reaped] == 1


def child_pid(directory: Path) -> int:
    (counter,) = directory.glob("counter_*.db")
    return int(counter.stem.split("_")[1])


def test_given_gunicorn_workers_on_one_port_then_every_scrape_counts_all_and_an_exited_worker_hands_back_its_gauges(
        tmp_path):
    from prometheus_client.mmap_dict import MmapedDict

    port = free_port()
    env = child_env(PROMETHEUS_MULTIPROC_DIR=str(tmp_path), DJANGO_DEBUG="0", LEASES_POD_AUTOSTART="0",
                    DJANGO_LOG_LEVEL="WARNING")
    master = subprocess.Popen([str(Path(sys.executable).with_name("gunicorn")), "-c", "config/gunicorn.conf.py",
                               "config.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "2"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _answers(f"{base}/api/v1/openapi.json"), 60, step=0.5), "gunicorn did not answer"
        served = {requests.get(f"{base}/api/v1/openapi.json", headers={"Connection": "close"}, timeout=10).status_code
                  for _ in range(12)}
        assert served == {200}
        # when: scraped several times (each scrape may land on either worker)
        totals = {_requests_to_openapi(scrape(f"{base}/metrics")) for _ in range(6)}
        # then: every scrape counts every worker's requests (the 12, and the readiness probes)
        assert len(totals) == 1 and min(totals) >= 12, totals
        # when: a worker exits (the master replaces it) while a gauge of it is live
        workers = [int(p) for p in Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text().split()]
        live = tmp_path / f"gauge_livesum_{workers[0]}.db"
        MmapedDict(str(live)).close()
        os.kill(workers[0], signal.SIGTERM)
        # then: the master's child_exit hook dropped it
        assert wait_for(lambda: not live.exists(), 30, step=0.2), "child_exit did not mark the worker dead"
    finally:
        os.killpg(master.pid, signal.SIGTERM)
        try:
            master.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(master.pid, signal.SIGKILL)
            master.wait(timeout=10)


def _requests_to_openapi(samples) -> float:
    return sum(value for (name, labels), value in samples.items()
               if name == "django_http_requests_total_by_view_transport_method_total" and ("method", "GET") in labels
               and any(k == "view" and "openapi" in v for k, v in labels))
