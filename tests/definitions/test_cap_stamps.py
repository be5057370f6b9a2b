"""A lowered cap is in force on every process at once: the definition write stamps it onto
the counters it governs, and a booking from a view loaded before the stamp obeys it."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time

import pytest

import leases
from leases.definitions import layers as config, model as definitions
from leases.definitions.model import document_path
from leases.store import client as store
from tests.definitions.test_invalidation import CAPS, command, start_holder, stop
from tests.helpers import PYTHON, REPO, child_env, private_redis

# Process B, started (and Django set up) before Redis freezes: writes the System layer on
# each line it reads and answers how long the write took.
STANDING_WRITER = textwrap.dedent("""
    import json, sys, time
    import django
    django.setup()
    from leases.definitions import layers as config
    from leases.definitions.model import document_path
    print("ready", flush=True)
    for line in sys.stdin:
        started = time.monotonic()
        config.put_document("_vance", "_tenant", document_path("tex"), line.strip())
        print(json.dumps({"seconds": time.monotonic() - started}), flush=True)
""")


def test_given_a_frozen_redis_when_another_process_lowers_the_cap_then_the_stale_cache_cannot_book_past_it():
    with private_redis() as (url, redis_server):
        config.put_document("_vance", "_tenant", document_path("tex"), CAPS.format(2))
        # given: A holds 1 of a global cap of 2, the definition cached and served (live)
        holder, first = start_holder(url)
        writer = subprocess.Popen([PYTHON, "-c", STANDING_WRITER], cwd=REPO, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  env=child_env(LEASES_REDIS_URL=url, LEASES_INVALIDATION_LIVENESS_MS="200"))
        try:
            assert writer.stdout.readline().strip() == "ready"
            assert first == {"cap": 2, "listening": True, "cached": True}
            # when: Redis freezes and B lowers the cap to 1 (its change event cannot reach A)
            redis_server.send_signal(signal.SIGSTOP)
            frozen = time.monotonic()
            assert command(writer, CAPS.format(1))["seconds"] < 2.0
            # then: A, still serving its cached cap of 2 within its liveness bound, is refused
            answer = command(holder, "acquire")
            assert time.monotonic() - frozen < 2.0  # A's cache was still being served: no lapse
            assert (answer["outcome"], answer["cap"]) == ("busy", 2), answer
            # and the stored cap is the lowered one: A's attempt did not raise it back
            assert store.counters().find_one({"_id": "tex2pdf|global|*"})["cap"] == 1
        finally:
            redis_server.send_signal(signal.SIGCONT)
            stop(holder)
            writer.stdin.close()
            writer.wait(timeout=10)


# --- in one process: a stale view is a definition loaded before the write ----------------------


@pytest.fixture(autouse=True)
def handler():
    from leases.revocation import handlers

    h = handlers.register_handler(type("StampHandler", (handlers.LeaseHandler,), {"type": "stamp",
                                                                                   "on_revoked": lambda s, h: None})())
    yield h
    handlers.unregister_handler("stamp")


def put(text, tenant="_vance", project="_tenant", name="res"):
    config.put_document(tenant, project, document_path(name), text)


def req(tenant="acme", project="p1", user="u1"):
    return leases.LeaseRequest(type="stamp", lease="res", tenant_id=tenant, project_id=project, user_id=user,
                               wait_ms=0)


def acquire_with(view, request):
    """Acquire as a process whose cache still serves ``view`` (loaded before a write)."""
    original = definitions.resolve
    definitions.resolve = lambda name, tenant, project: view  # the stale cache entry
    try:
        return leases.acquire(request)
    finally:
        definitions.resolve = original


def stored(key):
    return store.counters().find_one({"_id": key})


def test_given_a_view_from_before_a_tenant_write_then_it_obeys_the_lowered_cap_there_and_only_there():
    put("levels: {tenant: 2}")
    leases.acquire(req())
    leases.acquire(req(tenant="globex"))
    stale_acme, stale_globex = definitions.load("res", "acme", "p1"), definitions.load("res", "globex", "p1")
    born = stored("res|tenant|globex")["capStamps"]  # its creator's settle, from a fresh read
    # when: acme's tenant layer lowers its tenant cap to 1
    put("levels: {tenant: 1}", tenant="acme")
    # then: acme's stale view (cap 2) cannot take a 2nd slot, and does not raise the stored cap
    with pytest.raises(leases.LeaseBusy):
        acquire_with(stale_acme, req(user="u2"))
    assert (stored("res|tenant|acme")["count"], stored("res|tenant|acme")["cap"]) == (1, 1)
    # and globex's counter is not governed by acme's layer: its stale view takes its 2nd
    assert acquire_with(stale_globex, req(tenant="globex", user="u2")).token
    assert (stored("res|tenant|globex")["count"], stored("res|tenant|globex")["cap"]) == (2, 2)
    assert stored("res|tenant|globex")["capStamps"] == born  # not stamped by acme's write


def test_given_a_view_from_before_a_lowering_when_acquiring_async_then_it_obeys_the_stamp_too():
    from tests.engine.test_aio import run

    put("levels: {global: 2}")
    leases.acquire(req())
    stale = definitions.load("res", "acme", "p1")
    put("levels: {global: 1}")
    original = definitions.resolve
    definitions.resolve = lambda name, tenant, project: stale
    try:
        with pytest.raises(leases.LeaseBusy):
            run(leases.aacquire(req(user="u2")))
    finally:
        definitions.resolve = original
    assert (stored("res|global|*")["count"], stored("res|global|*")["cap"]) == (1, 1)


def test_given_a_raised_cap_then_old_views_keep_their_own_and_new_views_book_up_to_it_and_set_it(monkeypatch):
    from leases.definitions import caps

    monkeypatch.setattr(caps, "MARGIN", __import__("datetime").timedelta(milliseconds=1))
    put("levels: {global: 1}")
    first = leases.acquire(req())
    stale = definitions.load("res", "acme", "p1")
    put("levels: {global: 2}")
    assert stored("res|global|*")["cap"] == 2  # the write stamped the raise
    # given: a view from before the raise keeps its own cap of 1
    with pytest.raises(leases.LeaseBusy):
        acquire_with(stale, req(user="u2"))
    # when: the bundled default or a direct store edit raises it with no write to stamp it
    time.sleep(0.3)  # past the stamp by more than the (shrunk) margin and the clock estimate's lag
    store.config_documents().update_one({"tenantId": "_vance", "projectId": "_tenant", "path": document_path("res")},
                                        {"$set": {"text": "levels: {global: 3}"}})
    definitions.cache.clear()
    # then: a view loaded after the stamp books on its own cap and sets the stored one
    assert leases.acquire(req(user="u2")).token and leases.acquire(req(user="u3")).token
    assert (stored("res|global|*")["count"], stored("res|global|*")["cap"]) == (3, 3)
    first.release()


def test_given_a_project_write_then_it_stamps_its_project_counter_and_its_tenants_user_counters_with_the_largest_cap():
    put("levels: {project: 5, user: 3}")
    put("levels: {user: 4}", tenant="acme", project="p2")
    leases.acquire(req(project="p1"))
    leases.acquire(req(project="p2", user="u2"))
    leases.acquire(req(project="p3"))
    born = stored("res|project|acme/p3")["capStamps"]  # its creator's settle, from a fresh read
    # when: p1 lowers its project cap and its user cap
    put("levels: {project: 1, user: 1}", tenant="acme", project="p1")
    # then: p1's project counter has cap 1, p3's is not governed by p1's layer
    assert stored("res|project|acme/p1")["capStamps"]["res"]["cap"] == 1
    assert stored("res|project|acme/p3")["capStamps"] == born  # not stamped by p1's write
    # and a user counter, booked from every project of acme, has the largest of their caps
    assert {stored(f"res|user|acme/{u}")["capStamps"]["res"]["cap"] for u in ("u1", "u2")} == {4}


def test_given_a_waiter_queued_before_a_lowering_when_a_slot_frees_then_the_queue_does_not_grant_past_the_new_cap():
    import threading

    put("levels: {global: 2}\nwaitMs: 3000")
    a, b = leases.acquire(req()), leases.acquire(req(user="u2"))
    outcome = []

    def wait():  # its attempt keeps the definition it started with for its whole wait
        try:
            outcome.append(leases.acquire(leases.LeaseRequest(type="stamp", lease="res", tenant_id="acme",
                                                              project_id="p1", user_id="u3", wait_ms=1500)))
        except leases.LeaseBusy as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 5
    while not (stored("res|global|*") or {}).get("queue") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stored("res|global|*")["queue"], "the waiter never queued"
    # when: the cap is lowered to 1 and one of the two holders leaves
    put("levels: {global: 1}\nwaitMs: 3000")
    a.release()
    waiter.join(10)
    # then: one slot stays held (b's) and the waiter, whose view says 2, is not granted the freed one
    assert isinstance(outcome[0], leases.LeaseBusy), outcome
    assert (stored("res|global|*")["count"], stored("res|global|*")["cap"]) == (1, 1)
    b.release()
