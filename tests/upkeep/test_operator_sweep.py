"""``manage.py lease sweep`` with real processes: the round runs on a live pod, with its handlers.

Pods are real OS processes (``tests.workers.handler_pod``) whose own code registers the type
``podonly``; neither this test process nor the ``lease`` CLI process has that handler. A
pod is killed with SIGKILL and the test waits until the shared liveness definition calls
it dead (its interval × factor passed) before sweeping. Where a handler ran is read from
what the handler itself wrote (``test_handler_runs``) and from the tombstone's claim.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time

import pytest

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.pods.liveness import liveness
from leases.revocation import dispatch, handlers
from leases.revocation.dispatch import LeaseRevocationDispatcher
from leases.store import client as store
from leases.upkeep import reaper
from tests.helpers import PYTHON, REPO, child_env, wait_for

RUNS = "test_handler_runs"
START_TIMEOUT_S = 60.0
DEATH_TIMEOUT_S = 20.0


@pytest.fixture(autouse=True)
def _definition():
    config.put_document("_vance", "_tenant", document_path("podonly"), "levels: {tenant: 5}\nttlSeconds: 600")


def _env(pod_id: str, *, interval: int, factor: int) -> dict:
    from django.conf import settings

    return child_env(POD_ID=pod_id, LEASES_POD_AUTOSTART="0", LEASES_POD_INTERVAL_MIN="1",
                     LEASES_POD_INTERVAL_SECONDS=str(interval), LEASES_POD_EXPIRY_FACTOR=str(factor),
                     LEASES_INTERNAL_SECRET=settings.LEASES_INTERNAL_SECRET, DJANGO_LOG_LEVEL="WARNING",
                     PYTHONUNBUFFERED="1")


@pytest.fixture
def spawn():
    """Start ``tests.workers.handler_pod`` processes; all are killed (SIGKILL) at the end."""
    started: list[tuple[subprocess.Popen, object]] = []

    def start(pod_id: str, *, hold: bool = False, interval: int = 2, factor: int = 3) -> tuple[subprocess.Popen, dict]:
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen([PYTHON, "-m", "tests.workers.handler_pod", *(["--hold"] if hold else [])],
                                cwd=REPO, env=_env(pod_id, interval=interval, factor=factor),
                                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        started.append((proc, log))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("{"):
                return proc, json.loads(line)
            if not line and proc.poll() is not None:
                log.seek(0)
                raise AssertionError(f"pod {pod_id} exited early:\n{log.read()[-3000:]}")
        raise AssertionError(f"pod {pod_id} did not start in {START_TIMEOUT_S}s")

    yield start
    for proc, log in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def _kill_and_wait_dead(proc: subprocess.Popen, pod_id: str) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    # The event the sweep needs: the one liveness definition calls the pod dead.
    assert wait_for(lambda: pod_id not in liveness.alive_pods(), DEATH_TIMEOUT_S, step=0.2), \
        f"pod {pod_id} still alive {DEATH_TIMEOUT_S}s after SIGKILL"


def _runs(token: str) -> list[dict]:
    return list(store.db()[RUNS].find({"token": token}, {"_id": 0}))


def _cli(*args: str) -> subprocess.CompletedProcess:
    from django.conf import settings

    return subprocess.run([PYTHON, "manage.py", "lease", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=child_env(LEASES_INTERNAL_SECRET=settings.LEASES_INTERNAL_SECRET,
                                                     DJANGO_LOG_LEVEL="WARNING"))


def test_given_a_killed_pod_with_a_type_only_pods_know_when_operator_sweeps_then_the_handler_runs_on_a_live_pod(spawn):
    # Given: pod A holds a not-pod-bound "podonly" lease with a payload; pod B (same code,
    # so it has the handler) is alive; A is killed and has become dead.
    holder_proc, a = spawn("pod-a", hold=True, interval=1, factor=1)
    _, b = spawn("pod-b")
    assert store.holders().find_one({"_id": a["token"]})["pod"] == "pod-a"
    _kill_and_wait_dead(holder_proc, "pod-a")

    # When: the operator sweeps from a process that has no "podonly" handler.
    done = _cli("sweep", "--json")

    # Then: the round ran on pod B, which reaped the holder and ran the handler with the payload.
    assert done.returncode == 0, done.stderr
    assert wait_for(lambda: _runs(a["token"]), 10) == [
        {"pod": "pod-b", "token": a["token"], "payload": {"sessionId": "s-42", "endpoint": "http://127.0.0.1:9/mcp"},
         "reason": "pod"}], f"no handler ran on a live pod; the CLI said:\n{done.stdout}"
    answer = json.loads(done.stdout)
    assert answer["via"] == "pod pod-b" and answer["pod"] == "pod-b"
    [row] = [h for h in answer["holders"] if h["token"] == a["token"]]
    assert (row["outcome"], row["ranOn"], row["handlerRan"], row["reason"]) == ("local-payload", "pod-b", True, "pod")
    assert answer["dispatchSettled"] is True and answer["unhandled"] == []
    assert store.holders().find_one({"_id": a["token"]}) is None
    assert store.tombstones().find_one({"_id": a["token"]})["handledBy"] == "pod-b"


def test_given_no_live_pod_when_operator_sweeps_then_it_refuses_and_reaps_nothing(spawn):
    holder_proc, a = spawn("pod-a", hold=True, interval=1, factor=1)
    _kill_and_wait_dead(holder_proc, "pod-a")

    refused = _cli("sweep", "--json")

    assert refused.returncode == 1
    assert "no live pod" in refused.stdout and "--force" in refused.stdout  # --json: the error is JSON
    assert store.holders().find_one({"_id": a["token"]}) is not None  # not reaped where no handler runs


def test_given_no_live_pod_when_operator_sweeps_with_force_then_reaped_and_output_says_no_handler_ran(spawn):
    holder_proc, a = spawn("pod-a", hold=True, interval=1, factor=1)
    _kill_and_wait_dead(holder_proc, "pod-a")

    forced = _cli("sweep", "--force", "--json")

    assert forced.returncode == 0, forced.stderr
    answer = json.loads(forced.stdout)
    assert answer["via"] == "mongodb --force" and answer["handlersRan"] is False
    assert "dispatchSettled" not in answer  # nothing was dispatched, so nothing can have settled
    [row] = [h for h in answer["holders"] if h["token"] == a["token"]]
    assert (row["outcome"], row["handlerRan"]) == ("not-run", False)
    assert "NO handler ran" in answer["note"] and "left to its own expiration" in answer["note"]
    assert "s-42" in answer["note"]
    assert store.holders().find_one({"_id": a["token"]}) is None
    assert "handledBy" not in store.tombstones().find_one({"_id": a["token"]})
    assert _runs(a["token"]) == []


class _AcquireOnly(handlers.LeaseHandler):
    type = "podonly"

    def on_revoked(self, holder):
        raise AssertionError("unregistered before any revocation")


def test_given_no_handler_here_when_dispatching_then_a_live_peer_with_the_handler_runs_it(spawn):
    # A reaper pod whose code lacks the type (this test process) hands the revocation on.
    _, b = spawn("pod-b")
    handlers.register_handler(_AcquireOnly())  # only to acquire: a type needs a handler
    try:
        lease = leases.acquire(leases.LeaseRequest(type="podonly", lease="podonly", tenant_id="t1", project_id="p1",
                                                   user_id="u1", pod="gone-pod"))
        lease.update_payload({"sessionId": "s-7"})
    finally:
        handlers.unregister_handler("podonly")
    holder = reaper.reap_holder({"_id": lease.token}, "pod")
    local = LeaseRevocationDispatcher(max_workers=1)
    try:
        outcome = local._outcome(holder)
    finally:
        local.shutdown()

    assert (outcome.path, outcome.ran_on) == (dispatch.PEER, "pod-b")
    assert wait_for(lambda: _runs(lease.token), 10)[0]["pod"] == "pod-b"
    assert _runs(lease.token)[0]["payload"] == {"sessionId": "s-7"}
