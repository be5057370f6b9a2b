"""Wait tickets over real HTTP (a gunicorn process on the test database).

An acquire that outwaits its bound keeps its place: 202 with a ticket; polling it reports
the position, grants the lease (the acquire's 201 body) in its turn and answers that lease
again; DELETE abandons it; a ticket nobody polls is dropped (EXPIRED); unknown, foreign and
malformed ids are refused like lease tokens.
"""

from __future__ import annotations

import math
import subprocess
import threading
import time
import uuid
from datetime import datetime, timedelta

import pytest
import requests

from leases.api import keys, protocol
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.store import client as store
from leases.upkeep import reaper
from tests.helpers import PYTHON, REPO, child_env, ensure_tenant
from tests.http_server import running_server

TYPE = "tex"
POLL_SECONDS = 2  # a ticket lives 6 s unpolled (an in-server waiter's own TTL is 3 s: told apart)
WAIT_BOUND_SECONDS = 30  # every wait for a condition below ends by then


@pytest.fixture(scope="module")
def server(django_db_setup):
    with running_server(workers=2, threads=2, env={"LEASES_TICKET_POLL_SECONDS": str(POLL_SECONDS)}) as base_url:
        yield base_url


@pytest.fixture(autouse=True)
def scopes():
    ensure_tenant("acme", "p1", "p2", "p3")
    ensure_tenant("globex")


def session_for(tenant: str, project: str | None = None) -> requests.Session:
    secret = keys.create_key(tenant_id=tenant, project_id=project, name="tickets", acting_user="test")[1]
    session = requests.Session()
    session.headers.update({"Authorization": f"Bearer {secret}"})
    return session


@pytest.fixture
def acme():
    with session_for("acme") as session:
        yield session


@pytest.fixture
def globex():
    with session_for("globex") as session:
        yield session


@pytest.fixture
def lease_name():
    """A lease of one global slot, named per test (the server process caches definitions)."""
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    config.put_document("_vance", "_tenant", document_path(name), "levels: {global: 1}\nttlSeconds: 30\nwaitMs: 60000\n")
    return name


def acquire(server, session, lease, *, project="p1", user="u1", wait_ms=100, **extra):
    body = {"type": TYPE, "projectId": project, "userId": user, "lease": lease, "waitMs": wait_ms, **extra}
    return session.post(f"{server}/api/v1/leases", json=body, timeout=30)


def poll(server, session, ticket_id):
    return session.get(f"{server}/api/v1/tickets/{ticket_id}", timeout=30)


def abandon(server, session, ticket_id):
    return session.delete(f"{server}/api/v1/tickets/{ticket_id}", timeout=30)


def assert_problem(response, status, code):
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == code and body["status"] == status
    return body


def assert_ticket(response, status, lease):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"ticket", "resource", "leaseName", "position", "level", "pollIntervalSeconds",
                         "deadline", "serverTime", "estimatedGrantAt", "estimatedWaitSeconds"}
    assert body["leaseName"] == lease and body["pollIntervalSeconds"] == POLL_SECONDS
    # Retry-After: the estimated wait (rounded up), never later than the poll interval.
    expected = POLL_SECONDS if body["estimatedWaitSeconds"] is None else max(1, min(
        POLL_SECONDS, math.ceil(body["estimatedWaitSeconds"])))
    assert response.headers["Retry-After"] == str(expected)
    assert response.headers["Cache-Control"] == "no-store"
    return body


def queued(server, session, lease, **extra):
    response = acquire(server, session, lease, **extra)
    body = assert_ticket(response, 202, lease)
    assert response.headers["Location"] == f"/api/v1/tickets/{body['ticket']}"
    return body


def queue_entry(ticket_id):
    gate = store.counters().find_one({"queue.id": ticket_id})
    return next(t for t in gate["queue"] if t["id"] == ticket_id)


def until(condition, what):
    """Poll ``condition`` until it holds (bounded); returns its last value."""
    give_up = time.monotonic() + WAIT_BOUND_SECONDS
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < give_up, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_given_a_busy_lease_when_acquiring_then_202_with_a_ticket_and_its_place_on_server_time(server, acme, lease_name):
    # Given one global slot, held
    holder = acquire(server, acme, lease_name)
    assert holder.status_code == 201, holder.text
    # When a second acquire outwaits its bound
    ticket = queued(server, acme, lease_name, user="u2")
    # Then it keeps its place: first in line, blocked at the global level, due on the server's clock
    assert ticket["position"] == 1 and ticket["level"] == "global"
    assert ticket["resource"] == holder.json()["resource"]
    doc = store.holders().find_one({"_id": ticket["ticket"]})
    assert doc["state"] == "PENDING" and doc["tenantId"] == "acme" and doc["userId"] == "u2"
    # The deadline is the ticket's last keep-alive plus three poll intervals, on MongoDB's clock
    mine = queue_entry(ticket["ticket"])
    assert mine["ttl"] == 3 * POLL_SECONDS * 1000
    assert ticket["deadline"] == protocol.iso(mine["seen"] + timedelta(milliseconds=mine["ttl"]))
    assert ticket["deadline"] > ticket["serverTime"]  # ISO UTC strings of one format compare as times


def test_given_two_tickets_when_the_one_ahead_leaves_then_the_position_moves_up(server, acme, lease_name):
    assert acquire(server, acme, lease_name).status_code == 201
    first = queued(server, acme, lease_name, user="u2")
    second = queued(server, acme, lease_name, user="u3")
    assert (first["position"], second["position"]) == (1, 2)
    # When the one ahead abandons its place
    assert abandon(server, acme, first["ticket"]).status_code == 204
    # Then the next poll reports the place moved up
    assert assert_ticket(poll(server, acme, second["ticket"]), 200, lease_name)["position"] == 1


def test_given_a_ticket_when_the_holder_releases_then_the_next_poll_grants_the_acquire_body_and_again(
        server, acme, lease_name):
    held = acquire(server, acme, lease_name, proposedIntervalSeconds=5).json()
    ticket = queued(server, acme, lease_name, user="u2", proposedIntervalSeconds=4)
    # Still waiting while the slot is held
    assert assert_ticket(poll(server, acme, ticket["ticket"]), 200, lease_name)["position"] == 1
    # When the holder releases
    assert acme.delete(f"{server}/api/v1/leases/{held['token']}", timeout=30).json()["released"] is True
    # Then the next poll answers 201 with exactly the acquire body, the ticket id as token
    granted = poll(server, acme, ticket["ticket"])
    assert granted.status_code == 201, granted.text
    grant = granted.json()
    assert set(grant) == set(held)
    doc = store.holders().find_one({"_id": ticket["ticket"]})
    assert doc["state"] == "HELD" and grant["token"] == ticket["ticket"]
    # The interval the acquire proposed, clamped and stored as acquire does
    assert grant["intervalSeconds"] == 4 == doc["intervalSeconds"]
    assert grant["expiryDeadline"] == protocol.iso(doc["expiresAt"]) and grant["noop"] is False
    # Polling again answers the same lease (a lost answer can be fetched twice)
    again = poll(server, acme, ticket["ticket"])
    assert again.status_code == 201 and again.json() == grant
    # It is a lease like any other: renew and release work on its token
    assert acme.post(f"{server}/api/v1/leases/{grant['token']}/renew", json={}, timeout=30).status_code == 200
    assert abandon(server, acme, ticket["ticket"]).status_code == 204
    assert store.holders().count_documents({}) == 0
    assert_problem(poll(server, acme, ticket["ticket"]), 410, "EXPIRED")


def test_given_a_grant_without_a_proposal_when_polled_then_the_default_interval_is_issued(server, acme, lease_name):
    held = acquire(server, acme, lease_name).json()
    ticket = queued(server, acme, lease_name, user="u2")
    acme.delete(f"{server}/api/v1/leases/{held['token']}", timeout=30)
    grant = poll(server, acme, ticket["ticket"]).json()
    assert grant["intervalSeconds"] == protocol.choose_interval(30, None) == held["intervalSeconds"]
    assert store.holders().find_one({"_id": ticket["ticket"]})["intervalSeconds"] == grant["intervalSeconds"]


def test_given_a_ticket_when_deleted_then_204_its_place_is_gone_and_a_later_poll_is_expired(server, acme, lease_name):
    assert acquire(server, acme, lease_name).status_code == 201
    ticket = queued(server, acme, lease_name, user="u2")
    response = abandon(server, acme, ticket["ticket"])
    assert response.status_code == 204 and response.content == b""
    assert store.holders().find_one({"_id": ticket["ticket"]}) is None
    assert store.counters().find_one({"queue.id": ticket["ticket"]}) is None
    body = assert_problem(poll(server, acme, ticket["ticket"]), 410, "EXPIRED")
    assert body["reason"] == "abandoned"
    # Idempotent: a second DELETE answers like a second lease release
    again = abandon(server, acme, ticket["ticket"])
    assert again.status_code == 200, again.text
    assert again.json() == {"token": ticket["ticket"], "released": False, "alreadyReleased": True,
                            "reason": "abandoned"}


def test_given_a_ticket_nobody_polls_when_its_deadline_passes_then_a_poll_is_expired(server, acme, lease_name):
    assert acquire(server, acme, lease_name).status_code == 201
    ticket = queued(server, acme, lease_name, user="u2")
    mine = queue_entry(ticket["ticket"])
    deadline = mine["seen"] + timedelta(milliseconds=mine["ttl"])
    # When the server's clock passes the ticket's deadline without a poll
    until(lambda: store.server_now() > deadline, "the ticket's deadline on the server clock")
    # Then polling it is too late: EXPIRED, terminal, and nothing of it is left
    body = assert_problem(poll(server, acme, ticket["ticket"]), 410, "EXPIRED")
    assert body["reason"] == "ticket-expired"
    assert_problem(poll(server, acme, ticket["ticket"]), 410, "EXPIRED")
    assert store.holders().find_one({"_id": ticket["ticket"]}) is None
    assert store.counters().find_one({"queue.id": ticket["ticket"]}) is None


def test_given_a_ticket_that_is_polled_when_longer_than_its_keep_passes_then_it_keeps_its_place(
        server, acme, lease_name):
    assert acquire(server, acme, lease_name).status_code == 201
    ticket = queued(server, acme, lease_name, user="u2")
    first_deadline = ticket["deadline"]
    # Polled at the issued interval until the server's clock is past the first deadline
    last = ticket
    give_up = time.monotonic() + WAIT_BOUND_SECONDS
    while last["serverTime"] <= first_deadline and time.monotonic() < give_up:
        time.sleep(POLL_SECONDS)
        last = assert_ticket(poll(server, acme, ticket["ticket"]), 200, lease_name)
    assert last["serverTime"] > first_deadline
    assert last["position"] == 1 and last["deadline"] > first_deadline


def test_given_a_ticket_kept_longer_than_the_lease_ttl_when_idle_holders_are_reaped_then_it_keeps_its_place(
        server, acme):
    # Given a lease of a 2 s TTL (shorter than the ticket's 6 s keep) whose only slot is held,
    # and a ticket behind it
    name = f"short-{uuid.uuid4().hex[:8]}"
    config.put_document("_vance", "_tenant", document_path(name), "levels: {global: 1}\nttlSeconds: 2\n")
    held = acquire(server, acme, name).json()
    ticket = queued(server, acme, name, user="u2")
    # When it is polled, and the idle reap runs more than the lease TTL after that poll (within
    # the ticket's own deadline; the holder of the slot keeps renewing meanwhile)
    assert_ticket(poll(server, acme, ticket["ticket"]), 200, name)
    one_ttl_later = queue_entry(ticket["ticket"])["seen"] + timedelta(seconds=2)

    def renewed_until_one_ttl_passed():
        assert acme.post(f"{server}/api/v1/leases/{held['token']}/renew", json={}, timeout=30).status_code == 200
        return store.server_now() > one_ttl_later

    until(renewed_until_one_ttl_passed, "the server clock one lease TTL past the poll")
    assert store.server_now() < queue_entry(ticket["ticket"])["seen"] + timedelta(milliseconds=3 * POLL_SECONDS * 1000)
    reaper.reap_idle(dispatch=False)
    # Then the polled ticket still waits in its place (the reap takes only what nobody keeps)
    assert store.holders().find_one({"_id": ticket["ticket"]})["state"] == "PENDING"
    assert assert_ticket(poll(server, acme, ticket["ticket"]), 200, name)["position"] == 1


def test_given_an_unknown_ticket_when_polled_or_deleted_then_410_stale_lease(server, acme):
    unknown = "x" * 32
    assert_problem(poll(server, acme, unknown), 410, "STALE_LEASE")
    assert_problem(abandon(server, acme, unknown), 410, "STALE_LEASE")


def test_given_another_tenants_ticket_when_polled_or_deleted_then_it_is_unknown_and_untouched(
        server, acme, globex, lease_name):
    assert acquire(server, acme, lease_name).status_code == 201
    ticket = queued(server, acme, lease_name, user="u2")
    before = store.holders().find_one({"_id": ticket["ticket"]})
    assert_problem(poll(server, globex, ticket["ticket"]), 410, "STALE_LEASE")
    assert_problem(abandon(server, globex, ticket["ticket"]), 410, "STALE_LEASE")
    assert store.holders().find_one({"_id": ticket["ticket"]}) == before
    assert assert_ticket(poll(server, acme, ticket["ticket"]), 200, lease_name)["position"] == 1


def test_given_a_project_bound_key_when_polling_another_projects_ticket_then_it_is_unknown(server, acme, lease_name):
    assert acquire(server, acme, lease_name).status_code == 201
    ticket = queued(server, acme, lease_name, project="p2", user="u2")
    with session_for("acme", "p3") as bound:
        assert_problem(poll(server, bound, ticket["ticket"]), 410, "STALE_LEASE")
        assert_problem(abandon(server, bound, ticket["ticket"]), 410, "STALE_LEASE")
    assert store.holders().find_one({"_id": ticket["ticket"]})["state"] == "PENDING"


@pytest.mark.parametrize("bad", ["short", "has$dollar" + "x" * 10, "a" * 65, "%7B%22%24gt%22%3A%22%22%7D"])
def test_given_a_malformed_ticket_id_when_polled_or_deleted_then_400_before_any_query(server, acme, bad):
    assert_problem(poll(server, acme, bad), 400, "INVALID_REQUEST")
    assert_problem(abandon(server, acme, bad), 400, "INVALID_REQUEST")


def test_given_a_zero_wait_when_the_lease_is_busy_then_429_and_no_ticket(server, acme, lease_name):
    assert acquire(server, acme, lease_name).status_code == 201
    assert_problem(acquire(server, acme, lease_name, user="u2", wait_ms=0), 429, "LEASE_BUSY")
    assert store.holders().count_documents({"state": "PENDING"}) == 0


def test_given_an_inline_definition_when_busy_then_429_and_no_ticket(server, acme):
    inline = {"name": "solo", "levels": {"user": 1}, "ttlSeconds": 30}
    body = {"type": TYPE, "projectId": "p1", "userId": "u1", "inline": inline, "waitMs": 100}
    assert acme.post(f"{server}/api/v1/leases", json=body, timeout=30).status_code == 201
    assert_problem(acme.post(f"{server}/api/v1/leases", json=body, timeout=30), 429, "LEASE_BUSY")
    assert store.holders().count_documents({"state": "PENDING"}) == 0


def test_given_a_wrong_method_when_calling_a_ticket_then_405_with_allow(server, acme):
    response = acme.post(f"{server}/api/v1/tickets/{'x' * 32}", json={}, timeout=30)
    assert_problem(response, 405, "METHOD_NOT_ALLOWED")
    assert response.headers["Allow"] == "GET, DELETE"


@pytest.mark.parametrize("value", ["0", "61", "soon"])
def test_given_a_broken_ticket_poll_setting_when_starting_then_the_process_refuses_to_start(value):
    result = subprocess.run([PYTHON, "-c", "import django; django.setup()"], cwd=REPO, capture_output=True, text=True,
                            timeout=60, env=child_env(LEASES_TICKET_POLL_SECONDS=value))
    assert result.returncode != 0
    assert "LEASES_TICKET_POLL_SECONDS must be" in result.stderr


def test_given_a_hold_history_when_a_ticket_is_issued_then_it_carries_the_estimated_grant_time(server, acme, lease_name):
    # Given: one hold of the resource has been released (the gate now knows a typical hold).
    first = acquire(server, acme, lease_name)
    time.sleep(0.3)
    assert acme.delete(f"{server}/api/v1/leases/{first.json()['token']}", timeout=30).status_code == 200
    holder = acquire(server, acme, lease_name)
    assert holder.status_code == 201
    # When: two requests queue behind the holder.
    one = queued(server, acme, lease_name, user="u2")
    two = queued(server, acme, lease_name, user="u3")
    # Then: each has an estimate, the second about one hold later than the first.
    assert one["estimatedWaitSeconds"] is not None and two["estimatedWaitSeconds"] is not None
    assert 0.1 <= one["estimatedWaitSeconds"] <= 1.0
    assert two["estimatedWaitSeconds"] - one["estimatedWaitSeconds"] == pytest.approx(
        2 * one["estimatedWaitSeconds"], rel=0.2)
    assert one["estimatedGrantAt"] >= one["serverTime"]
    for ticket in (one, two):
        abandon(server, acme, ticket["ticket"])


@pytest.fixture
def classes_lease():
    name = f"cls-{uuid.uuid4().hex[:8]}"
    config.put_document("_vance", "_tenant", document_path(name),
                        "levels: {global: 1}\nttlSeconds: 30\nwaitMs: 60000\npriorities: [interactive, batch]\n"
                        "allowedPriorities: {globex: [batch]}\n")
    return name


def test_given_classes_when_acquiring_with_a_priority_over_http_then_it_is_validated_and_carried(
        server, acme, globex, classes_lease):
    assert_problem(acquire(server, acme, classes_lease, priority="urgent"), 400, "INVALID_REQUEST")
    assert_problem(acquire(server, acme, classes_lease, priority=3), 400, "INVALID_BODY")
    body = assert_problem(acquire(server, globex, classes_lease, priority="interactive"), 403, "PRIORITY_NOT_ALLOWED")
    assert "globex" in body["detail"]
    assert store.holders().count_documents({"leaseName": classes_lease}) == 0  # nothing written
    held = acquire(server, globex, classes_lease, priority="batch")
    assert held.status_code == 201, held.text
    ticket = queued(server, acme, classes_lease, user="u2", priority="interactive")
    assert queue_entry(ticket["ticket"])["pn"] == "interactive"
    abandon(server, acme, ticket["ticket"])
    globex.delete(f"{server}/api/v1/leases/{held.json()['token']}", timeout=30)


def test_given_the_http_client_then_it_sends_the_priority_and_raises_the_typed_refusal(server, classes_lease):
    from leases.client import HttpLeaseClient
    from leases.errors import InvalidLeaseRequest, PriorityNotAllowed

    acme_secret = keys.create_key(tenant_id="acme", project_id=None, name="cl", acting_user="test")[1]
    globex_secret = keys.create_key(tenant_id="globex", project_id=None, name="cl", acting_user="test")[1]
    with pytest.raises(PriorityNotAllowed):
        HttpLeaseClient(server, globex_secret).acquire(type=TYPE, user_id="u", project_id="p1", lease=classes_lease,
                                                        priority="interactive", wait_ms=0)
    with pytest.raises(InvalidLeaseRequest):
        HttpLeaseClient(server, acme_secret).acquire(type=TYPE, user_id="u", project_id="p1", lease=classes_lease,
                                                      priority="nope", wait_ms=0)
    lease = HttpLeaseClient(server, acme_secret).acquire(type=TYPE, user_id="u", project_id="p1",
                                                          lease=classes_lease, priority="interactive", wait_ms=0)
    assert store.holders().find_one({"_id": lease.token})["priority"] == "interactive"
    lease.release()


def test_given_a_kept_ticket_when_the_holder_releases_then_the_release_grants_it_and_the_next_poll_claims_it(
        server, acme, lease_name):
    held = acquire(server, acme, lease_name).json()
    ticket = queued(server, acme, lease_name, user="u2")["ticket"]
    # When the holder releases, while the ticket's client is between polls
    assert acme.delete(f"{server}/api/v1/leases/{held['token']}", timeout=30).json()["released"] is True
    # Then the release booked the slot for the ticket (the direct hand-off) and dequeued it;
    # its holder waits for the poll to claim it: no claim window but the poll deadline
    gate = store.counters().find_one({"holders": {"$regex": f"/{ticket}$"}})
    assert gate is not None and all(t["id"] != ticket for t in gate.get("queue") or ())
    assert ticket not in (gate.get("claims") or {})
    assert store.holders().find_one({"_id": ticket})["state"] == "PENDING"
    granted = poll(server, acme, ticket)
    assert granted.status_code == 201, granted.text
    doc = store.holders().find_one({"_id": ticket})
    assert doc["state"] == "HELD" and granted.json()["fence"] == doc["fence"] is not None
    assert abandon(server, acme, ticket).status_code == 204


def long_poll(server, session, ticket_id, wait_ms):
    return session.get(f"{server}/api/v1/tickets/{ticket_id}", params={"waitMs": wait_ms}, timeout=30)


def test_given_a_poll_that_waits_when_the_holder_releases_then_it_answers_the_grant_at_once(server, acme, lease_name):
    held = acquire(server, acme, lease_name).json()
    ticket = queued(server, acme, lease_name, user="u2")["ticket"]
    before = store.holders().find_one({"_id": ticket})["polledAt"]
    answers = []
    started = time.monotonic()
    waiting = threading.Thread(target=lambda: answers.append((long_poll(server, acme, ticket, 5000), time.monotonic())))
    waiting.start()
    # When the poll is under way (it moved the ticket's deadline) and then the holder releases
    until(lambda: store.holders().find_one({"_id": ticket})["polledAt"] > before, "the poll to reach the server")
    released = time.monotonic()
    assert acme.delete(f"{server}/api/v1/leases/{held['token']}", timeout=30).json()["released"] is True
    waiting.join(WAIT_BOUND_SECONDS)
    # Then the waiting poll answers the lease, long before its 5 s wait ends (the release's
    # wake-up reached the process where it waits; without it the grant waited for the poll's end)
    response, answered = answers[0]
    assert response.status_code == 201, response.text
    assert answered - released < 3.0 and answered - started < 4.5, (answered - released, answered - started)
    doc = store.holders().find_one({"_id": ticket})
    assert doc["state"] == "HELD" and response.json()["fence"] == doc["fence"] is not None
    assert abandon(server, acme, ticket).status_code == 204


def test_given_a_poll_that_waits_when_nothing_frees_then_it_answers_at_the_end_of_its_wait_poll_again_now(
        server, acme, lease_name):
    held = acquire(server, acme, lease_name).json()
    ticket = queued(server, acme, lease_name, user="u2")["ticket"]
    started = time.monotonic()
    response = long_poll(server, acme, ticket, 5000)
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    # It waited two poll intervals, not the 5 s asked: the poll kept the ticket for three from
    # its start, and the one that ends the wait must come in time to keep it again.
    assert 2 * POLL_SECONDS - 0.1 <= elapsed < 2 * POLL_SECONDS + 0.9, elapsed
    assert response.headers["Retry-After"] == "0" and response.json()["position"] == 1
    # The ticket's deadline is a full keep from the wait's end (polled again then)
    body = response.json()
    left = datetime.fromisoformat(body["deadline"]) - datetime.fromisoformat(body["serverTime"])
    assert left >= timedelta(seconds=3 * POLL_SECONDS - 1), left
    assert store.holders().find_one({"_id": ticket})["state"] == "PENDING"
    assert abandon(server, acme, ticket).status_code == 204
    assert acme.delete(f"{server}/api/v1/leases/{held['token']}", timeout=30).status_code == 200


@pytest.mark.parametrize("query", ["waitMs=abc", "waitMs=-1", "waitMs=600001", "waitMs=1&waitMs=2", "waitMs=1&other=1",
                                   "wait=5"])
def test_given_a_bad_wait_when_polling_then_400_and_the_ticket_is_untouched(server, acme, lease_name, query):
    acquire(server, acme, lease_name)
    ticket = queued(server, acme, lease_name, user="u2")["ticket"]
    before = store.holders().find_one({"_id": ticket})
    response = acme.get(f"{server}/api/v1/tickets/{ticket}?{query}", timeout=30)
    assert_problem(response, 400, "INVALID_REQUEST")
    assert store.holders().find_one({"_id": ticket}) == before
