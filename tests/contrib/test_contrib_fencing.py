"""Reference consumers and fencing: the tex consumer sends its fence with the compile
submission and the compile service (the demo service, with a FenceGuard) refuses a stale one;
the session consumer records its fence with the session."""

from __future__ import annotations

import pytest

import leases
from leases.contrib import jobs, sessions
from leases.contrib.demo import DemoRemoteServer, submit_job
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.errors import StaleFence
from leases.fencing import FenceGuard
from leases.store import client as store, fence_codec
from leases.upkeep import reaper

AUTH = "Bearer s3cret"


@pytest.fixture
def compile_service(mongo_db):
    server = DemoRemoteServer(auth=AUTH, job_seconds=0.05,
                              guard=FenceGuard(mongo_db["compile_fences"], resource="tex2pdf")).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _definitions():
    config.put_document("_vance", "_tenant", document_path("tex"), "levels: {global: 1}\nttlSeconds: 30\nwaitMs: 0")


def poll(service):
    return lambda job_id: (lambda r: r if r.get("status") == "done" else None)(
        jobs_status(service, job_id))


def jobs_status(service, job_id):
    from leases.contrib.demo import _http_json

    return _http_json("GET", f"{service.url}/jobs/{job_id}")


def test_given_a_job_then_its_submission_carries_the_leases_fence(compile_service):
    fences_seen = []

    def submit(fence):
        fences_seen.append(fence)
        return submit_job(compile_service.url, fence)

    result = jobs.run_job(submit=submit, poll=poll(compile_service), tenant_id="t1", project_id="p1", user_id="u1",
                          poll_interval=0.02, timeout=10)
    assert result["status"] == "done"
    (fence,) = fences_seen
    assert fence_codec.decode(fence).counter == "tex2pdf|global|*"
    assert list(compile_service.job_fences.values()) == [fence]


def test_given_a_holder_reaped_while_stalled_then_the_compile_service_refuses_its_late_submission(compile_service):
    request = leases.LeaseRequest(type="tex", lease="tex", tenant_id="t1", project_id="p1", user_id="u1")
    # Given: a holder that passed check() and stalled; reaped meanwhile; its slot granted again
    # and the new holder submitted.
    stalled = leases.acquire(request)
    stalled.check()
    reaper.reap({"_id": stalled.token}, "idle")
    fresh = leases.acquire(request)
    submit_job(compile_service.url, fresh.fence)
    # When: the stalled holder wakes and submits with its fence.
    # Then: the compile service refuses it, and no job is started for it.
    with pytest.raises(StaleFence):
        submit_job(compile_service.url, stalled.fence)
    assert list(compile_service.job_fences.values()) == [fresh.fence]
    fresh.release()


def test_given_a_submission_without_a_valid_fence_then_the_guarded_service_refuses_it(compile_service):
    import leases.http_client

    with pytest.raises(leases.http_client.HttpCallFailed):
        submit_job(compile_service.url, None)
    assert compile_service.job_fences == {}


def test_given_a_session_then_its_fence_is_recorded_with_the_session_on_both_sides(mongo_db):
    config.put_document("_vance", "_tenant", document_path("browser"), "ttlSeconds: 30\nwaitMs: 0")
    with DemoRemoteServer(auth=AUTH) as remote:
        sessions.register_tool("browser-tool", remote.mcp_endpoint, auth=AUTH)
        try:
            client = sessions.SessionClient("browser-tool", tenant_id="t1", project_id="p1", user_id="u1")
            client.call("tools/call", {"n": 1})
            session = sessions.pool.get(client.key)
            holder = store.holders().find_one({"_id": session.token})
            assert session.fence is not None and session.fence == holder["fence"]
            assert holder["payload"]["fence"] == session.fence
            assert remote.sessions[session.session_id]["fence"] == session.fence
            client.close()
        finally:
            sessions.unregister_tool("browser-tool")
            sessions.pool.close_all()
