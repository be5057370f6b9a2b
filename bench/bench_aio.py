"""Async API benchmark: commands and latency of ``aacquire``/``acheck``/``arelease`` beside the
sync path, and a contended queue of async waiters drained by a sync holder's release.

Prints markdown tables. Run: ``python bench/bench_aio.py [--cycles 300] [--waiters 100]``
(embedded server unless MONGODB_URI is set). Not a test: it measures; it exits 1 only when
the uncontended async commands differ from the sync ones.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _setup import CommandCounter, register_bench_handler, setup  # noqa: E402


def _define(name: str, body: str) -> None:
    from leases.definitions import layers as config
    from leases.definitions.model import document_path

    config.put_document("_vance", "_tenant", document_path(name), body)


def _req(name: str, user: str = "u1"):
    import leases

    return leases.LeaseRequest(type="bench", lease=name, tenant_id="acme", project_id="p1", user_id=user)


def _ms(samples: list[float]) -> str:
    samples = sorted(samples)
    p95 = samples[int(len(samples) * 0.95) - 1] if len(samples) >= 20 else samples[-1]
    return f"{statistics.median(samples) * 1000:.2f} | {p95 * 1000:.2f}"


def uncontended(cycles: int) -> int:
    import pymongo
    from django.conf import settings

    import leases
    from leases import aio
    from leases.store import client as store

    _define("aio4", "levels: {global: 1000, tenant: 1000, project: 1000, user: 1000}\nttlSeconds: 60")
    leases.acquire(_req("aio4")).release()  # counters exist, cache warm
    sync_counter, async_counter = CommandCounter(), CommandCounter()
    sync_client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[sync_counter])
    store.set_client(sync_client)
    store.set_async_client_factory(lambda: pymongo.AsyncMongoClient(settings.MONGODB_URI,
                                                                    event_listeners=[async_counter]))
    rows, failed = [], 0
    try:
        timings = {"acquire": [], "check": [], "release": []}
        sync_counter.names.clear()
        for _ in range(cycles):
            t0 = time.perf_counter()
            lease = leases.acquire(_req("aio4"))
            t1 = time.perf_counter()
            lease.check()
            t2 = time.perf_counter()
            lease.release()
            t3 = time.perf_counter()
            for key, value in zip(timings, (t1 - t0, t2 - t1, t3 - t2)):
                timings[key].append(value)
        sync_cmds = len(sync_counter.names) / cycles

        async def run_async():
            atimings = {"acquire": [], "check": [], "release": []}
            await (await leases.aacquire(_req("aio4"))).arelease()
            async_counter.names.clear()
            sync_counter.names.clear()
            for _ in range(cycles):
                t0 = time.perf_counter()
                lease = await leases.aacquire(_req("aio4"))
                t1 = time.perf_counter()
                await lease.acheck()
                t2 = time.perf_counter()
                await lease.arelease()
                t3 = time.perf_counter()
                for key, value in zip(atimings, (t1 - t0, t2 - t1, t3 - t2)):
                    atimings[key].append(value)
            await aio.aclose()
            return atimings, len(async_counter.names) / cycles, len(sync_counter.names) / cycles

        atimings, async_cmds, async_sync_cmds = asyncio.run(run_async())
        for op in timings:
            rows.append(f"| {op} | {_ms(timings[op])} | {_ms(atimings[op])} |")
        if async_cmds != sync_cmds or async_sync_cmds:
            failed = 1
    finally:
        store.set_client(None)
        store.set_async_client_factory(None)
        sync_client.close()
    print(f"### Uncontended, 4 levels, {cycles} cycles (ms)\n")
    print("| op | sync median | sync p95 | async median | async p95 |\n|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nCommands per cycle: sync {sync_cmds:.1f}, async {async_cmds:.1f} on the async client "
          f"+ {async_sync_cmds:.1f} on the sync one\n")
    return failed


def contended(waiters: int) -> None:
    import leases
    from leases import aio
    from leases.store import client as store

    _define("aio1", "levels: {global: 1}\nwaitMs: 60000\nttlSeconds: 60")
    held = leases.acquire(leases.LeaseRequest(type="bench", lease="aio1", tenant_id="other", project_id="p",
                                              user_id="u"))

    async def take(user: str) -> float:
        lease = await leases.aacquire(_req("aio1", user))
        granted = time.perf_counter()
        await lease.arelease()
        return granted

    async def main():
        threads_before = threading.active_count()
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(take(f"w{i}")) for i in range(waiters)]
        while True:
            gate = store.counters().find_one({"_id": "aio1|global|*"}) or {}
            if len(gate.get("queue") or ()) == waiters:
                break
            await asyncio.sleep(0.01)
        queued_s = time.perf_counter() - t0
        threads = threading.active_count() - threads_before
        t1 = time.perf_counter()
        await asyncio.to_thread(held.release)
        grants = await asyncio.gather(*tasks)
        drain_s = max(grants) - t1
        await aio.aclose()
        return queued_s, threads, drain_s

    queued_s, threads, drain_s = asyncio.run(main())
    print(f"### {waiters} async waiters on one slot (one event loop)\n")
    print("| queued all (s) | extra threads while waiting | drain: release to last grant (s) | per grant (ms) |")
    print("|---|---|---|---|")
    print(f"| {queued_s:.2f} | {threads} | {drain_s:.2f} | {drain_s / waiters * 1000:.1f} |\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--waiters", type=int, default=100)
    args = parser.parse_args()
    setup("bench_aio")
    register_bench_handler()
    from leases.store import client as store

    for name in (store.HOLDERS, store.COUNTERS):
        store.db()[name].delete_many({})
    failed = uncontended(args.cycles)
    contended(args.waiters)
    return failed


if __name__ == "__main__":
    sys.exit(main())
