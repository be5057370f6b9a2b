"""The dispatch matrix (where a revoked holder's handler runs, by pod liveness and pod
binding), the internal revocation endpoint, and asynchronous dispatch.

The foreign-pod rows go over real HTTP: this process serves the Django app on a free port
(``internal_server.serve_internal``) and a registered "foreign" pod points at it. The multi-process
version (separate pod processes, Celery worker and beat) is in ``test_chaos.py``.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.test import Client

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.engine import holders
from leases.errors import BodyTooLarge, LeaseExpired
from leases.pods import internal_server, leases as pod_leases
from leases.pods.identity import self_pod_id
from leases.revocation import dispatch, explain, handlers, listener
from leases.revocation.dispatch import LeaseRevocationDispatcher
from leases.store import client as store
from leases.store.embedded import free_port
from leases.upkeep import reaper


class Recording(handlers.LeaseHandler):
    type = "rec"

    def __init__(self):
        self.seen = []
        self.threads = []
        self.ran = threading.Event()

    def on_revoked(self, holder):
        self.seen.append(holder)
        self.threads.append(threading.current_thread().name)
        self.ran.set()


@pytest.fixture
def recorder():
    handler = handlers.register_handler(Recording())
    yield handler
    handlers.unregister_handler("rec")


@pytest.fixture
def dispatcher():
    d = LeaseRevocationDispatcher(max_workers=2)
    yield d
    d.drain()
    d.shutdown()


@pytest.fixture(autouse=True)
def _definition():
    config.put_document("_vance", "_tenant", document_path("res"),
                        "levels: {global: 50, user: 5}\nttlSeconds: 60\nwaitMs: 0")


@pytest.fixture(scope="module")
def own_endpoint(django_db_setup):
    return internal_server.serve_internal("127.0.0.1:0")


def take(pod=None, pod_bound=False, user="u1"):
    lease = leases.acquire(leases.LeaseRequest(type="rec", lease="res", tenant_id="t1", project_id="p1",
                                               user_id=user, pod=pod, pod_bound=pod_bound))
    lease.update_payload({"jobId": "j-1"})
    return lease


def revoke(lease):
    holder = reaper.reap_holder({"_id": lease.token}, "revoke")
    assert holder is not None
    return holder


def test_given_holder_of_this_pod_then_handler_runs_locally(recorder, dispatcher):
    holder = revoke(take())
    assert dispatcher.dispatch(holder) == "local"
    assert [h.token for h in recorder.seen] == [holder.token]


def test_given_alive_foreign_pod_then_revocation_is_posted_and_its_handler_runs_there(recorder, dispatcher, own_endpoint):
    pod_leases.register("foreign-pod", own_endpoint)
    holder = revoke(take(pod="foreign-pod", pod_bound=True))
    assert dispatcher.dispatch(holder) == "forwarded"
    assert dispatch.get_dispatcher().drain()
    assert recorder.ran.wait(5)
    assert [(h.token, h.payload, h.reason) for h in recorder.seen] == [(holder.token, {"jobId": "j-1"}, "revoke")]
    assert store.tombstones().find_one({"_id": holder.token})["handledBy"] == self_pod_id()


@pytest.mark.parametrize("pod_bound, path, runs", [(True, "release-only", 0), (False, "local-payload", 1)])
def test_given_alive_foreign_pod_unreachable_then_post_failure_falls_to_the_dead_rows(recorder, dispatcher, pod_bound, path, runs):
    pod_leases.register("mute-pod", f"http://127.0.0.1:{free_port()}")  # registered, but nothing listens
    holder = revoke(take(pod="mute-pod", pod_bound=pod_bound))
    assert dispatcher.dispatch(holder) == path
    assert len(recorder.seen) == runs
    if runs:
        assert recorder.seen[0].payload == {"jobId": "j-1"}


@pytest.mark.parametrize("pod, pod_bound, path, runs", [
    ("dead-pod", True, "release-only", 0),
    ("dead-pod", False, "local-payload", 1),
    ("never-registered", False, "local-payload", 1),
    ("", False, "local-payload", 1),  # detached (HTTP client): no pod, the reaper cleans up
    # Detached and pod-bound: no pod can have taken the resource along, so release only
    # would leave it running; the not-pod-bound row applies.
    ("", True, "local-payload", 1),
])
def test_given_dead_or_detached_pod_then_matrix_row_applies(recorder, dispatcher, pod, pod_bound, path, runs):
    granted = pod_leases.register("dead-pod", "http://127.0.0.1:9")
    store.pods().update_one({"_id": "dead-pod"}, {"$set": {"expiryDeadline": store.server_now() - timedelta(seconds=1)}})
    assert granted.ok
    holder = revoke(take(pod=pod, pod_bound=pod_bound))
    assert dispatcher.dispatch(holder) == path
    assert len(recorder.seen) == runs
    if runs:
        assert recorder.seen[0].payload == {"jobId": "j-1"}


def test_given_the_reaps_tombstone_was_lost_when_the_handler_is_claimed_then_the_token_answers_expired_in_its_scope(
        recorder, dispatcher):
    holder = revoke(take())
    store.tombstones().delete_one({"_id": holder.token})  # the reap's tombstone write failed
    assert dispatcher.dispatch(holder) == "local"
    tombstone = store.tombstones().find_one({"_id": holder.token})
    assert (tombstone["tenantId"], tombstone["projectId"], tombstone["resource"], tombstone["reason"],
            tombstone["handledBy"]) == ("t1", "p1", "res", "revoke", self_pod_id())
    # A tenant-bound lookup (HTTP renew, release, ticket poll) says it ended, and why.
    answer = holders.ended(holder.token, holders.scope("t1", "p1"))
    assert isinstance(answer, LeaseExpired) and answer.reason == "revoke"


def test_given_the_reaps_tombstone_when_the_handler_is_claimed_then_its_time_and_reason_stay(recorder, dispatcher):
    holder = revoke(take())
    before = store.tombstones().find_one({"_id": holder.token})
    store.tombstones().update_one({"_id": holder.token}, {"$set": {"reason": "pod"}})
    assert dispatcher.dispatch(holder) == "local"
    after = store.tombstones().find_one({"_id": holder.token})
    assert (after["at"], after["reason"], after["tenantId"]) == (before["at"], "pod", "t1")
    assert dispatcher.dispatch(holder) == dispatch.ALREADY_HANDLED  # claimed once


def test_given_no_handler_here_and_no_peer_then_outcome_says_no_handler_ran(recorder):
    holder = revoke(take(pod="gone-pod"))
    handlers.unregister_handler("rec")  # a type only other pods' code registers
    lonely = LeaseRevocationDispatcher(max_workers=1, peers=lambda: [])
    try:
        outcome = lonely._outcome(holder)
    finally:
        lonely.shutdown()
    assert (outcome.path, outcome.ran_on, outcome.handler_ran) == (dispatch.NO_HANDLER, None, False)
    assert "handledBy" not in store.tombstones().find_one({"_id": holder.token})  # nobody claimed it


def test_given_no_handler_here_then_peers_are_offered_it_until_one_accepts(recorder):
    holder = revoke(take(pod="gone-pod"))
    handlers.unregister_handler("rec")
    offered = []

    def post(endpoint, revoked):
        offered.append(endpoint)
        return endpoint == "http://second"

    relay = LeaseRevocationDispatcher(max_workers=1, post=post,
                                      peers=lambda: [("gone-pod", "http://holder"), ("p1", "http://first"),
                                                     ("p2", "http://second"), ("p3", "http://third")])
    try:
        outcome = relay._outcome(holder)
    finally:
        relay.shutdown()
    # The holder's own (dead) pod is never offered; the first peer that accepts takes it.
    assert offered == ["http://first", "http://second"]
    assert (outcome.path, outcome.ran_on) == (dispatch.PEER, "p2")


@pytest.mark.parametrize("pod, pod_bound, alive, expected", [
    ("pod-a", True, True, "the tex handler is dispatched to pod pod-a"),
    ("pod-a", True, False, "no handler runs: the holder was pod-bound to the dead pod pod-a"),
    ("pod-a", False, False, "the tex handler is dispatched with the stored payload (pod pod-a is dead)"),
    ("", True, False, "the tex handler is dispatched with the stored payload (a detached holder has no pod, "
                      "so pod-bound does not apply)"),
    ("", False, False, "the tex handler is dispatched with the stored payload (detached holder)"),
])
def test_dispatch_note_follows_the_matrix_rows(pod, pod_bound, alive, expected):
    assert explain.dispatch_note("tex", pod, pod_bound, alive).startswith(expected)
    assert dispatch.releases_only(pod, pod_bound, alive) is expected.startswith("no handler runs")


def test_given_same_revocation_dispatched_twice_then_handler_runs_at_most_once(recorder, dispatcher):
    holder = revoke(take(pod="gone-pod"))
    assert dispatcher.dispatch(holder) == "local-payload"
    assert dispatcher.dispatch(holder) == "already-handled"
    assert LeaseRevocationDispatcher(max_workers=1).dispatch(holder) == "already-handled"
    assert len(recorder.seen) == 1


class Blocking(Recording):
    """Blocks in ``on_revoked`` until released: proves the notifier returned while it ran."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def on_revoked(self, holder):
        self.entered.set()
        assert self.release.wait(10)
        super().on_revoked(holder)


def test_given_slow_handler_when_notified_then_the_caller_does_not_wait(dispatcher):
    slow = handlers.register_handler(Blocking())
    try:
        holder = revoke(take())
        dispatcher.on_revoked([holder])  # returns although the handler cannot finish yet
        assert slow.entered.wait(5) and slow.seen == []
        slow.release.set()
        assert dispatcher.drain(5)
        assert [h.token for h in slow.seen] == [holder.token]
        assert slow.threads[0].startswith("lease-dispatch")
    finally:
        slow.release.set()
        handlers.unregister_handler("rec")


def test_given_lazy_reap_on_acquire_then_the_installed_dispatcher_runs_the_handler(recorder):
    assert isinstance(listener.get_listener(), LeaseRevocationDispatcher)  # installed in ready()
    config.put_document("_vance", "_tenant", document_path("solo"), "levels: {user: 1}\nttlSeconds: 60\nwaitMs: 0")
    solo = leases.LeaseRequest(type="rec", lease="solo", tenant_id="t1", project_id="p1", user_id="u9")
    stale = leases.acquire(solo)
    store.holders().update_one({"_id": stale.token}, {"$set": {"expiresAt": store.server_now() - timedelta(seconds=1)}})
    fresh = leases.acquire(solo)  # the level is full: the lazy idle reap takes the stale holder
    assert dispatch.get_dispatcher().drain(5)
    assert [h.token for h in recorder.seen] == [stale.token]
    assert recorder.seen[0].reason == "idle"
    fresh.release()


def test_given_regular_release_then_handler_never_runs(recorder):
    lease = take()
    assert lease.release()
    assert dispatch.get_dispatcher().drain(5)
    assert recorder.seen == []


# --- the internal endpoint --------------------------------------------------------------


def post(client, body, secret="test-internal-secret", raw=None):
    headers = {} if secret is None else {"HTTP_X_LEASE_SECRET": secret}
    return client.post("/internal/lease/revoked", data=raw if raw is not None else json.dumps(body),
                       content_type="application/json", **headers)


@pytest.fixture
def csrf_client():
    return Client(enforce_csrf_checks=True)  # the endpoint is csrf_exempt, all else keeps CSRF on


@pytest.mark.parametrize("secret", [None, "", "wrong-secret", "test-internal-secret-but-longer", "tést"])
def test_given_missing_or_wrong_secret_then_the_post_is_refused_and_nothing_runs(recorder, csrf_client, secret):
    holder = revoke(take())
    response = post(csrf_client, holder.to_wire(), secret=secret)
    assert response.status_code == 403 and response.json()["code"] == "FORBIDDEN"
    assert dispatch.get_dispatcher().drain(5)
    assert recorder.seen == [] and "handledBy" not in store.tombstones().find_one({"_id": holder.token})


def test_given_right_secret_then_202_and_the_local_handler_runs_asynchronously(recorder, csrf_client):
    holder = revoke(take())
    response = post(csrf_client, holder.to_wire())
    assert response.status_code == 202 and response.json() == {"accepted": holder.token}
    assert dispatch.get_dispatcher().drain(5)
    assert [h.token for h in recorder.seen] == [holder.token]


def test_given_a_revocation_body_over_the_limit_then_413_with_the_body_too_large_code(recorder, csrf_client):
    holder = revoke(take())
    response = post(csrf_client, None, raw=json.dumps({**holder.to_wire(), "pad": "x" * (64 * 1024)}))
    assert response.status_code == 413 and response.json()["code"] == BodyTooLarge.code == "BODY_TOO_LARGE"
    assert dispatch.get_dispatcher().drain(5)
    assert recorder.seen == []


@pytest.mark.parametrize("mutate, status, code", [
    (lambda w: {**w, "token": {"$gt": ""}}, 400, "INVALID_REQUEST"),
    (lambda w: {**w, "token": "short"}, 400, "INVALID_REQUEST"),
    (lambda w: {**w, "type": "no-such-type"}, 404, "UNKNOWN_LEASE_TYPE"),
    (lambda w: {**w, "payload": {"$where": "1"}}, 400, "INVALID_REQUEST"),
    (lambda w: {**w, "podBound": "yes"}, 400, "INVALID_REQUEST"),
    (lambda w: [w], 400, "INVALID_REQUEST"),
])
def test_given_malformed_revocation_then_typed_error_and_nothing_runs(recorder, csrf_client, mutate, status, code):
    holder = revoke(take())
    response = post(csrf_client, mutate(holder.to_wire()))
    assert response.status_code == status and response.json()["code"] == code
    assert post(csrf_client, None, raw="{not json").status_code == 400
    assert dispatch.get_dispatcher().drain(5)
    assert recorder.seen == []


def test_given_token_still_held_then_409_and_no_handler(recorder, csrf_client):
    lease = take()
    wire = reaper.RevokedHolder.from_doc(store.holders().find_one({"_id": lease.token}), "revoke").to_wire()
    response = post(csrf_client, wire)
    assert response.status_code == 409 and response.json()["code"] == "LEASE_STILL_HELD"
    assert recorder.seen == []
    lease.check()  # still held
    lease.release()


def test_given_get_then_method_not_allowed(csrf_client):
    assert csrf_client.get("/internal/lease/revoked", HTTP_X_LEASE_SECRET="test-internal-secret").status_code == 405


# --- what operators are told (Insights) follows the same rows ---------------------------------


@pytest.fixture
def acme_admin():
    from django.contrib.auth import get_user_model

    from insights.models import Membership, Tenant

    tenant = Tenant.objects.create(slug="t1", name="T1")
    user = get_user_model().objects.create_user("t1-admin", password="pw-123456")
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.ADMIN)
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("pod, pod_bound, note, runs", [
    # Detached (HTTP clients) with podBound: true: the handler runs with the payload.
    ("", True, "the rec handler is dispatched with the stored payload (a detached holder has no pod, "
               "so pod-bound does not apply)", 1),
    ("gone-pod", True, "no handler runs: the holder was pod-bound to the dead pod gone-pod, "
                       "so its resource died with it (release only)", 0),
])
def test_given_insights_revoke_then_the_page_and_message_say_what_the_dispatcher_does(
        recorder, acme_admin, pod, pod_bound, note, runs):
    lease = take(pod=pod, pod_bound=pod_bound)
    url = f"/t/t1/insights/leases/holders/{lease.token}/revoke"

    confirm = acme_admin.get(url).content.decode()
    done = acme_admin.post(url, {"confirm": "on", "reason": "stuck"}, follow=True)

    assert f"and {note}." in " ".join(confirm.split())
    assert f"and {note}." in [str(m) for m in done.context["messages"]][0]
    assert dispatch.get_dispatcher().drain(5)
    assert [(h.token, h.payload) for h in recorder.seen] == [(lease.token, {"jobId": "j-1"})] * runs
