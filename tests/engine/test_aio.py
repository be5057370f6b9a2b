"""The async contract on pymongo's async client: acquire/check/release, busy, waiting, the cap
under concurrent async tasks in real processes, an ASGI view, outages, command budgets."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from functools import partial

import pymongo
import pytest
from django.test import AsyncClient, override_settings

import leases
from leases import aio
from leases.definitions import model as definitions
from leases.engine import holders
from leases.errors import LeaseExpired
from leases.revocation import handlers
from leases.store import client as store
from tests.helpers import PYTHON, REPO, CommandCounter, child_env, define, lease_request


class AioHandler(handlers.LeaseHandler):
    type = "aiotest"

    def on_revoked(self, holder):
        pass


@pytest.fixture(autouse=True)
def handler():
    yield handlers.register_handler(AioHandler())
    handlers.unregister_handler("aiotest")


put = partial(define, "aio")
req = partial(lease_request, lease="aio", lease_type="aiotest")


def run(coro):
    """Run ``coro`` on a fresh event loop, closing that loop's async client before it ends."""
    async def main():
        try:
            return await coro
        finally:
            await aio.aclose()

    return asyncio.run(main())


def gate_queue():
    """The tickets waiting at the gate: its head, then its backlog (leases.queue.backlog)."""
    head = [t["id"] for t in (store.counters().find_one({"_id": "aio|global|*"}) or {}).get("queue") or ()]
    return head + [d["_id"] for d in store.tickets().find({"g": "aio|global|*"}, {"_id": 1}).sort("at", 1)]


def count(key):
    doc = store.counters().find_one({"_id": key})
    return None if doc is None else doc["count"]


def test_given_a_free_resource_when_acquiring_async_then_check_and_release_work_like_the_sync_path():
    put("levels: {global: 3, tenant: 2, user: 1}\nttlSeconds: 30")

    async def scenario():
        lease = await leases.aacquire(req())
        holder = store.holders().find_one({"_id": lease.token})
        booked = [count(k) for k in lease.levels]
        await lease.acheck()
        await lease.aupdate_payload({"jobId": "$not-an-operator"})
        payload = store.holders().find_one({"_id": lease.token})["payload"]
        first, second = await lease.arelease(), await lease.arelease()
        with pytest.raises(leases.LeaseLost):
            await lease.acheck()
        return lease, holder, booked, payload, first, second

    lease, holder, booked, payload, first, second = run(scenario())
    assert lease.levels == ["aio|user|acme/u1", "aio|tenant|acme", "aio|global|*"]
    assert holder["state"] == "HELD" and holder["levels"] == lease.levels and booked == [1, 1, 1]
    assert payload == {"jobId": "$not-an-operator"}
    assert (first, second) == (True, False)
    assert [count(k) for k in lease.levels] == [0, 0, 0] and store.holders().count_documents({}) == 0
    # The hold's duration is kept on the gate for wait estimates, as by the sync release.
    assert len(store.counters().find_one({"_id": "aio|global|*"}).get("holds") or ()) == 1


def test_given_an_idle_expiry_whose_delete_failed_when_checked_async_again_then_still_expired(monkeypatch):
    # Given: an async lease past its deadline, and the first delete of its idle expiry fails.
    put("levels: {global: 1}")
    real_end, failed = holders.end, []

    def end_failing_once(query, reason, **kw):
        if not failed:
            failed.append(reason)
            raise pymongo.errors.AutoReconnect("injected: the idle expiry's delete failed")
        return real_end(query, reason, **kw)

    monkeypatch.setattr(holders, "end", end_failing_once)

    async def scenario():
        lease = await leases.aacquire(req())
        store.holders().update_one({"_id": lease.token}, [{"$set": {"expiresAt": {"$subtract": ["$$NOW", 1000]}}}])
        deadline = store.holders().find_one({"_id": lease.token})["expiresAt"]
        with pytest.raises(LeaseExpired):
            await lease.acheck()
        kept = store.holders().find_one({"_id": lease.token})["expiresAt"]
        # Then: the second check answers EXPIRED too (and reaps it), never a renewal.
        with pytest.raises(LeaseExpired):
            await lease.acheck()
        return deadline, kept

    deadline, kept = run(scenario())
    assert failed == ["idle"]
    assert kept == deadline
    assert count("aio|global|*") == 0 and store.holders().count_documents({}) == 0


def test_given_async_with_when_the_block_raises_then_the_lease_is_released():
    put("levels: {global: 1}")

    async def scenario():
        with pytest.raises(RuntimeError):
            async with leases.aacquire(req()) as lease:
                token = lease.token
                raise RuntimeError("body failed")
        return token

    token = run(scenario())
    assert store.holders().find_one({"_id": token}) is None and count("aio|global|*") == 0


def test_given_a_full_level_when_acquiring_async_then_busy_names_it_and_nothing_is_left():
    put("levels: {global: 5, user: 1}\nwaitMs: 0")
    held = leases.acquire(req())

    async def scenario():
        with pytest.raises(leases.LeaseBusy) as busy:
            await leases.aacquire(req())
        return busy.value

    busy = run(scenario())
    assert (busy.code, busy.level, busy.count, busy.cap) == ("LEASE_BUSY", "user", 1, 1)
    assert store.holders().count_documents({}) == 1 and count("aio|global|*") == 1
    held.release()


def test_given_bad_input_when_acquiring_async_then_refused_before_any_write():
    async def scenario():
        with pytest.raises(leases.InvalidLeaseRequest):
            await leases.aacquire(req(tenant="$where"))
        with pytest.raises(leases.UnknownLeaseType):
            await leases.aacquire(leases.LeaseRequest(type="nope", lease="aio", tenant_id="a", project_id="p",
                                                      user_id="u"))
        assert await leases.aacquire(leases.LeaseRequest(type="aiotest", tenant_id="a", project_id="p",
                                                         user_id="u")) is leases.ANOOP

    run(scenario())
    assert store.holders().count_documents({}) == 0


def test_given_a_sync_holder_when_it_releases_then_the_async_waiter_is_granted_and_the_loop_stayed_free():
    put("levels: {global: 1}\nwaitMs: 5000")
    held = leases.acquire(req(tenant="other"))
    threading.Timer(0.6, held.release).start()

    async def scenario():
        ticks = 0
        started = time.monotonic()
        waiter = asyncio.ensure_future(leases.aacquire(req()))
        while not waiter.done():
            ticks += 1
            await asyncio.sleep(0.01)
        lease = waiter.result()
        waited = time.monotonic() - started
        await lease.arelease()
        return waited, ticks

    waited, ticks = run(scenario())
    assert 0.5 < waited < 4.0
    assert ticks > 20  # the event loop ran other work while the request waited
    assert count("aio|global|*") == 0 and store.holders().count_documents({}) == 0


def test_given_an_async_waiter_granted_by_a_hand_off_then_it_claims_its_holder_with_a_plain_update(monkeypatch):
    # Given: an async waiter queued behind a sync holder; the commands its claim sends are
    # told apart from those of the other threads (release, repair, refresh) by the thread
    # that is inside the claim when the command starts.
    from leases.engine import funnel
    from tests.helpers import counted_commands

    inside = threading.local()
    claims: list[list[str]] = []
    original = funnel.Attempt.claim

    def claim(self, *args, **kwargs):
        inside.sent = []
        try:
            return original(self, *args, **kwargs)
        finally:
            claims.append(inside.sent)
            inside.sent = None

    monkeypatch.setattr(funnel.Attempt, "claim", claim)

    class ClaimCommands(CommandCounter):
        def started(self, event):
            if getattr(inside, "sent", None) is not None:
                inside.sent.append(event.command_name)

    put("levels: {global: 1}\nwaitMs: 5000")

    async def scenario():
        held = leases.acquire(req(tenant="other"))
        waiter = asyncio.ensure_future(leases.aacquire(req()))
        while not gate_queue():
            await asyncio.sleep(0.01)
        # When: the holder releases; the hand-off grants the waiter, which claims (at once,
        # or from the background when answered first) — waited for before the release,
        # which would make a pending claim unneeded.
        await asyncio.to_thread(held.release)
        lease = await waiter
        for _ in range(500):
            if claims:
                break
            await asyncio.sleep(0.01)
        await lease.arelease()

    with counted_commands(all_threads=True, listener=ClaimCommands(all_threads=True)):
        run(scenario())
    # Then: the claim is one plain update — no findAndModify, which the embedded server
    # answers by scanning the holders (6 ms each at 1,000 waiting holders).
    assert claims == [["update"]], claims


HOLD_IN_CHILD = """
import sys, time
import django
django.setup()
import leases
from leases.revocation import handlers

class H(handlers.LeaseHandler):
    type = "aiotest"
    def on_revoked(self, holder):
        pass

handlers.register_handler(H())
lease = leases.acquire(leases.LeaseRequest(type="aiotest", lease="aio", tenant_id="other", project_id="p1",
                                           user_id="child"))
print("HELD", flush=True)
sys.stdin.readline()
called = time.time()  # the hand-off may grant the waiter before release() returns
lease.release()
print("RELEASED", called, flush=True)
"""


def test_given_a_holder_in_another_process_when_it_releases_then_the_async_waiter_here_is_woken_and_granted():
    put("levels: {global: 1}\nwaitMs: 10000")
    child = subprocess.Popen([PYTHON, "-c", HOLD_IN_CHILD], cwd=REPO, env=child_env(DJANGO_LOG_LEVEL="WARNING"),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "HELD", child.stderr.read()[-3000:]

        async def scenario():
            waiter = asyncio.ensure_future(leases.aacquire(req()))
            for _ in range(300):
                await asyncio.sleep(0.01)
                if gate_queue():
                    break
            queued = list(gate_queue())
            child.stdin.write("go\n")
            child.stdin.flush()
            lease = await waiter
            granted_at = time.time()
            await lease.arelease()
            return queued, lease.token, granted_at

        queued, token, granted_at = run(scenario())
        released = child.stdout.readline().split()
        assert released[0] == "RELEASED"
        assert queued == [token]
        # Granted by the release in the other process (a keep-alive poll alone would take ~1 s).
        assert 0 <= granted_at - float(released[1]) < 0.9
    finally:
        child.kill()
        child.wait(timeout=10)
    assert count("aio|global|*") == 0 and store.holders().count_documents({}) == 0


def test_given_a_wait_that_stays_full_when_it_ends_then_busy_after_wait_ms_with_the_queue_position():
    put("levels: {global: 1}\nwaitMs: 400")
    held = leases.acquire(req(tenant="other"))

    async def scenario():
        started = time.monotonic()
        with pytest.raises(leases.LeaseBusy) as busy:
            await leases.aacquire(req())
        return time.monotonic() - started, busy.value

    waited, busy = run(scenario())
    assert 0.35 < waited < 2.0 and busy.position == 1  # first in the queue
    assert store.counters().find_one({"_id": "aio|global|*"}).get("queue") == []
    held.release()


def test_given_a_waiter_cancelled_while_it_waits_then_it_leaves_the_queue_at_once():
    put("levels: {global: 1}\nwaitMs: 5000")
    held = leases.acquire(req(tenant="other"))

    async def scenario():
        waiter = asyncio.ensure_future(leases.aacquire(req()))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if gate_queue():
                break
        queued = gate_queue()
        waiter.cancel()
        started = time.monotonic()
        while gate_queue() and time.monotonic() - started < 2:
            await asyncio.sleep(0.01)
        return queued, time.monotonic() - started, waiter.cancelled()

    queued, left_after, cancelled = run(scenario())
    assert len(queued) == 1 and cancelled
    assert left_after < 1.0  # dequeued by the cancellation, not by the ticket going stale (3 s)
    assert store.holders().find_one({"_id": queued[0]}) is None
    held.release()
    assert count("aio|global|*") == 0
    leases.acquire(req(tenant="third")).release()


def test_given_many_async_waiters_then_they_hold_no_thread_while_they_wait():
    put("levels: {global: 1}\nwaitMs: 20000")  # a loaded machine must not turn this into Busy
    held = leases.acquire(req(tenant="other"))

    async def take_and_give_back(user):
        lease = await leases.aacquire(req(user=user))
        await lease.arelease()  # at once: the queue drains in its own order
        return 1

    async def scenario():
        before = threading.active_count()
        waiters = [asyncio.ensure_future(take_and_give_back(f"w{i}")) for i in range(40)]
        for _ in range(1500):
            await asyncio.sleep(0.01)
            if len(gate_queue()) == 40:
                break
        queued, threads = len(gate_queue()), threading.active_count() - before
        await asyncio.to_thread(held.release)
        granted = sum(await asyncio.gather(*waiters))
        return queued, threads, granted

    queued, threads, granted = run(scenario())
    assert queued == 40 and granted == 40
    # The step pools, asyncio's default executor (validation and definitions) and the
    # subscriber: bounded by pool sizes, not one thread per waiter.
    assert threads <= aio.STEP_THREADS + aio.WOKEN_THREADS + min(32, (os.cpu_count() or 1) + 4) + 2 < 40
    assert count("aio|global|*") == 0 and store.holders().count_documents({}) == 0


def test_given_concurrent_async_tasks_in_three_processes_then_holders_never_exceed_the_cap():
    put("levels: {global: 2}\nwaitMs: 3000\nttlSeconds: 30")
    store.db()["aio_probe"].insert_one({"_id": "inside", "n": 0})
    start_at = time.time() + 3
    procs = [subprocess.Popen([PYTHON, "-m", "tests.workers.aio_cycler", str(i), "4", "8", str(start_at)],
                              cwd=REPO, env=child_env(DJANGO_LOG_LEVEL="WARNING"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert max(r["max"] for r in results) <= 2
    assert max(r["max"] for r in results) == 2  # the cap was reached, so the bound was tested
    assert sum(r["ok"] for r in results) + sum(r["busy"] for r in results) == 3 * 4 * 8
    assert sum(r["ok"] for r in results) > 0
    assert count("aio|global|*") == 0 and store.holders().count_documents({}) == 0
    assert store.db()["aio_probe"].find_one({"_id": "inside"})["n"] == 0


@override_settings(ROOT_URLCONF="tests.aio_urls")
def test_given_an_asgi_view_when_requests_come_in_then_it_holds_and_releases_the_lease_and_answers_busy():
    put("levels: {user: 1}\nwaitMs: 0")
    held = leases.acquire(req(tenant="acme", user="busy"))

    async def scenario():
        client = AsyncClient()
        ok = await client.get("/aio/acme/u1")
        busy = await client.get("/aio/acme/busy")
        return ok, busy

    ok, busy = run(scenario())
    assert ok.status_code == 200 and ok.json()["levels"] == ["aio|user|acme/u1"]
    assert store.holders().find_one({"_id": ok.json()["token"]}) is None and count("aio|user|acme/u1") == 0
    assert busy.status_code == 429 and busy.json() == {"code": "LEASE_BUSY", "level": "user"}
    held.release()


def test_given_an_unreachable_store_when_acquiring_async_then_unavailable_within_the_bound(settings):
    put("levels: {global: 1}")
    leases.acquire(req()).release()  # definition cached: the first store command is the holder's
    settings.MONGODB_URI = "mongodb://127.0.0.1:9/?directConnection=true"  # nothing listens
    settings.LEASES_MONGO_TIMEOUT_MS = 300
    try:
        async def scenario():
            started = time.monotonic()
            with pytest.raises(leases.LeaseUnavailable) as err:
                await leases.aacquire(req())
            return time.monotonic() - started, err.value

        took, err = run(scenario())
        assert err.code == "LEASE_UNAVAILABLE" and took < 3.0
    finally:
        store.reset()
        definitions.cache.clear()


def test_uncontended_async_command_budget_equals_the_sync_one():
    put("levels: {global: 9, tenant: 9, project: 9, user: 9}")
    from leases.definitions import invalidation
    assert invalidation.wait_listening()
    leases.acquire(req()).release()  # counters exist, cache warm
    from django.conf import settings

    counter = CommandCounter(all_threads=True)
    store.set_async_client_factory(lambda: pymongo.AsyncMongoClient(settings.MONGODB_URI, event_listeners=[counter]))

    async def scenario():
        await (await leases.aacquire(req())).arelease()  # the loop's client connected
        counter.commands.clear()
        lease = await leases.aacquire(req())
        acquire_cmds = list(counter.commands)
        counter.commands.clear()
        await lease.acheck()
        check_cmds = list(counter.commands)
        counter.commands.clear()
        await lease.arelease()
        return acquire_cmds, check_cmds, list(counter.commands)

    try:
        acquire_cmds, check_cmds, release_cmds = run(scenario())
    finally:
        store.set_async_client_factory(None)
    assert acquire_cmds == ["findAndModify", "update", "findAndModify"], acquire_cmds
    assert check_cmds == ["findAndModify"]
    # The holder first (a holder whose slot went on must never be left to renew), then the
    # narrower slots, the gate, the tombstone: the same four as before, in that order. The
    # delete is a plain one, as the sync release's: the lease knows what the holder holds (a
    # findAndModify, which the embedded server answers by scanning the holders, is not needed).
    assert release_cmds == ["delete", "update", "findAndModify", "update"]  # delete, slots, gate, tombstone
