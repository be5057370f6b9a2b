"""Reference consumers: the poll-loop job tracker (tex) and the remote HTTP session (browser).

The remote side is the demo service (real HTTP on 127.0.0.1), which records every
session DELETE with its Authorization header.
"""

from __future__ import annotations

import threading
import time

import pytest

import leases
from leases.contrib import jobs, sessions
from leases.contrib.demo import DemoRemoteServer, run_demo_consumers
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.revocation import dispatch
from leases.revocation.dispatch import LeaseRevocationDispatcher
from leases.store import client as store
from leases.upkeep import reaper

AUTH = "Bearer s3cret"


@pytest.fixture
def remote():
    server = DemoRemoteServer(auth=AUTH, job_seconds=0.3).start()
    yield server
    server.stop()


@pytest.fixture
def tool(remote):
    sessions.register_tool("browser-tool", remote.mcp_endpoint, auth=AUTH)
    yield sessions.get_tool("browser-tool")
    sessions.unregister_tool("browser-tool")
    sessions.pool.close_all()


@pytest.fixture(autouse=True)
def _fast_definitions():
    config.put_document("_vance", "_tenant", document_path("tex"), "ttlSeconds: 30\nwaitMs: 0")
    config.put_document("_vance", "_tenant", document_path("browser"), "ttlSeconds: 30\nwaitMs: 0")


def http_job(remote):
    import json
    import urllib.request

    def call(method, url):
        req = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=5) as response:
            return json.loads(response.read())

    submit = lambda: call("POST", remote.url + "/jobs")["jobId"]  # noqa: E731
    poll = lambda job_id: (lambda r: r if r["status"] == "done" else None)(call("GET", f"{remote.url}/jobs/{job_id}"))  # noqa: E731
    return submit, poll


# --- jobs -------------------------------------------------------------------------------


def test_given_job_when_run_then_payload_carries_job_id_checks_touch_and_lease_is_released(remote):
    submit, poll = http_job(remote)
    seen = {}

    def watching_poll(job_id):
        doc = store.holders().find_one({"payload.jobId": job_id})
        seen.setdefault("first", doc)
        seen["last"] = doc
        return poll(job_id)

    result = jobs.run_job(submit=submit, poll=watching_poll, tenant_id="t1", project_id="p1", user_id="u1",
                          poll_interval=0.05)
    assert result["status"] == "done"
    assert seen["first"]["podBound"] is True and seen["first"]["type"] == "tex"
    assert seen["last"]["lastSeenAt"] > seen["first"]["acquiredAt"]  # check() in every poll touched it
    assert store.holders().count_documents({}) == 0
    assert all(c["count"] == 0 for c in store.counters().find({}))
    assert jobs.tracker.running() == []


def test_given_running_loop_when_revoked_then_handler_aborts_it_and_nothing_is_left(remote):
    submit, _ = http_job(remote)
    outcome = {}

    def run():
        try:
            jobs.run_job(submit=submit, poll=lambda job_id: None, tenant_id="t1", project_id="p1", user_id="u1",
                         poll_interval=5.0, timeout=60)
        except jobs.JobAborted as exc:
            outcome["aborted"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 5
    # Wait until the loop polls: job submitted, payload stored, first check() done.
    while store.holders().find_one({"payload.jobId": {"$exists": True}}) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    token = jobs.tracker.running()[0]
    started = time.monotonic()
    holder = reaper.reap_holder({"_id": token}, "revoke")
    assert LeaseRevocationDispatcher(max_workers=1).dispatch(holder) == "local"
    thread.join(5)
    assert "aborted" in outcome and time.monotonic() - started < 2  # woke at once, not after 5 s
    assert jobs.tracker.running() == []
    assert store.holders().count_documents({}) == 0


def test_given_loop_already_ended_when_revocation_arrives_then_nothing_happens(remote):
    # given: a job whose loop has ended (its real token) and another loop still running
    # in the same tracker
    loops = jobs.JobTracker()
    submit, poll = http_job(remote)
    tokens = []

    def watching_poll(job_id):
        tokens.append(store.holders().find_one({"payload.jobId": job_id})["_id"])
        return poll(job_id)

    jobs.run_job(submit=submit, poll=watching_poll, tenant_id="t1", project_id="p1", user_id="u1", poll_interval=0.05,
                 job_tracker=loops)
    other = loops.register("other-token")
    handler = jobs.JobHandler(loops)

    def revoked(token):
        return reaper.RevokedHolder(token=token, type="tex", resource="tex2pdf", lease_name="tex", tenant_id="t1",
                                    project_id="p1", user_id="u1", holder_ref="", pod="x", pod_bound=True)

    # when: the ended loop's revocation arrives late
    handler.on_revoked(revoked(tokens[0]))
    # then: it touches no other loop and registers nothing for the ended one
    assert not other.aborted.is_set()
    assert loops.running() == ["other-token"]
    assert loops.abort(tokens[0]) is False
    # while the same handler does abort a loop that still runs
    handler.on_revoked(revoked("other-token"))
    assert other.aborted.is_set()


def test_given_bad_poll_interval_then_typed_error_and_nothing_acquired():
    with pytest.raises(leases.InvalidLeaseRequest):
        jobs.run_job(submit=lambda: "x", poll=lambda j: None, tenant_id="t1", project_id="p1", user_id="u1",
                     poll_interval=0)
    assert store.holders().count_documents({}) == 0


# --- sessions ---------------------------------------------------------------------------


def client_for(user="u1"):
    return sessions.SessionClient("browser-tool", tenant_id="t1", project_id="p1", user_id=user)


def test_given_session_when_calling_then_payload_is_endpoint_and_session_id_and_every_call_touches(tool, remote):
    client = client_for()
    client.call("tools/call", {"n": 1})
    session = sessions.pool.get(client.key)
    doc = store.holders().find_one({"_id": session.token})
    assert doc["podBound"] is False and doc["type"] == "browser"
    assert doc["payload"] == {"tool": "browser-tool", "endpoint": remote.mcp_endpoint, "sessionId": session.session_id,
                              "fence": session.fence}
    first_seen = doc["lastSeenAt"]
    time.sleep(0.01)
    client.call("tools/call", {"n": 2})
    assert store.holders().find_one({"_id": session.token})["lastSeenAt"] > first_seen
    client.close()
    assert [d["auth"] for d in remote.deletes_of(session.session_id)] == [AUTH]
    assert store.holders().count_documents({}) == 0


def test_given_lease_lost_when_calling_then_session_closes_and_next_call_opens_a_new_one(tool, remote):
    client = client_for()
    client.call("tools/call")
    old = sessions.pool.get(client.key)
    reaper.reap_holder({"_id": old.token}, "idle")  # reaped behind the session's back
    with pytest.raises(sessions.SessionRevoked) as caught:
        client.call("tools/call")
    assert caught.value.code == "SESSION_REVOKED" and isinstance(caught.value, leases.LeaseLost)
    assert len(remote.deletes_of(old.session_id)) == 1  # LeaseLost closed the remote session
    client.call("tools/call")
    new = sessions.pool.get(client.key)
    assert new.token != old.token and new.session_id != old.session_id
    assert store.holders().find_one({"_id": new.token})["payload"]["sessionId"] == new.session_id


def test_given_pooled_session_when_its_lease_is_revoked_then_handler_closes_it(tool, remote):
    client = client_for()
    client.call("tools/call")
    session = sessions.pool.get(client.key)
    holder = reaper.reap_holder({"_id": session.token}, "revoke")
    assert LeaseRevocationDispatcher(max_workers=1).dispatch(holder) == "local"
    assert session.closed and sessions.pool.get(client.key) is None
    assert len(remote.deletes_of(session.session_id)) == 1


def test_given_reopened_session_when_a_late_revocation_of_the_old_lease_arrives_then_it_closes_nothing(tool, remote):
    client = client_for()
    client.call("tools/call")
    old = sessions.pool.get(client.key)
    old_holder = reaper.reap_holder({"_id": old.token}, "idle")
    with pytest.raises(sessions.SessionRevoked):
        client.call("tools/call")
    client.call("tools/call")
    new = sessions.pool.get(client.key)
    sessions.SessionHandler().on_revoked(old_holder)  # delayed delivery of the old revocation
    assert not new.closed and sessions.pool.get(client.key) is new
    assert remote.deletes_of(new.session_id) == []
    client.call("tools/call")


def dead_pod_holder(remote, session_id, tool_name="browser-tool"):
    return reaper.RevokedHolder(token="deadtok" * 4, type="browser", resource="browser", lease_name="browser",
                                tenant_id="t1", project_id="p1", user_id="u1", holder_ref="", pod="dead-pod",
                                pod_bound=False, reason="pod",
                                payload={"tool": tool_name, "endpoint": remote.mcp_endpoint, "sessionId": session_id})


def test_given_dead_pods_session_then_handler_sends_delete_with_configured_auth(tool, remote):
    sessions.SessionHandler().on_revoked(dead_pod_holder(remote, "abc123"))
    assert remote.deletes_of("abc123") == [{"sessionId": "abc123", "auth": AUTH, "authorized": True}]


def test_given_tool_now_points_elsewhere_then_dead_pods_session_delete_is_skipped(tool, remote):
    sessions.register_tool("browser-tool", "http://127.0.0.1:9/mcp", auth=AUTH)
    sessions.SessionHandler().on_revoked(dead_pod_holder(remote, "abc123"))
    sessions.SessionHandler().on_revoked(dead_pod_holder(remote, "abc124", tool_name="unknown-tool"))
    assert remote.deleted == []


def test_given_tool_from_settings_then_it_is_used(settings, remote):
    settings.LEASES_SESSION_TOOLS = {"settings-tool": {"endpoint": remote.mcp_endpoint, "auth": AUTH}}
    assert sessions.get_tool("settings-tool") == sessions.ToolConfig("settings-tool", remote.mcp_endpoint, AUTH)


def test_given_handshake_fails_then_the_lease_is_returned_at_once(remote):
    sessions.register_tool("bad-auth", remote.mcp_endpoint, auth="Bearer wrong")
    try:
        with pytest.raises(sessions.SessionError):
            sessions.SessionClient("bad-auth", tenant_id="t1", project_id="p1", user_id="u1").call("tools/call")
        assert store.holders().count_documents({}) == 0
        assert all(c["count"] == 0 for c in store.counters().find({}))
    finally:
        sessions.unregister_tool("bad-auth")


def test_given_second_session_of_same_user_then_busy(tool):
    first = client_for()
    first.call("tools/call")
    other_pool = sessions.SessionPool()
    with pytest.raises(leases.LeaseBusy) as caught:
        sessions.SessionClient("browser-tool", tenant_id="t1", project_id="p2", user_id="u1",
                               session_pool=other_pool).call("tools/call")
    assert caught.value.level == "user"  # one browser session per user, across projects


def test_given_demo_consumers_when_run_then_jobs_compile_and_calls_go_through(remote):
    stats = run_demo_consumers(remote_url=remote.url, stop=threading.Event(), auth=AUTH, pause=0, rounds=2)
    assert stats == {"jobs": 2, "calls": 6, "busy": 0, "lost": 0, "stale": 0, "errors": 0}
    assert store.holders().count_documents({}) == 0
    assert remote.calls == 6 and len(remote.deleted) == 1
    assert dispatch.get_dispatcher().drain(5)
