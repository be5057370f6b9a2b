"""Sweep benchmark: cost of a sweep with 10k / 100k holders (1% expired), reconcile time,
and the time from ``kill -9`` of a pod to its slots being free.

Prints markdown tables. Run: ``python bench/bench_sweep.py [--sizes 10000,100000]``
(embedded server unless MONGODB_URI is set). Not a test: it measures, it asserts nothing.
Commands are counted with pymongo command monitoring on the engine's own client.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections import Counter as Tally
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _setup import REPO, CommandCounter, register_bench_handler, setup  # noqa: E402

BATCH = 1000
PODS = 20
USERS = 1000



def populate(total: int, expired_fraction: float = 0.01) -> int:
    """Insert ``total`` holders (2 levels each) and matching counters; returns the expired count."""
    import pymongo
    from django.conf import settings

    from leases.store import client as store

    # Bulk loading is slower than the engine's 2 s operation bound: no timeout here.
    loader = pymongo.MongoClient(settings.MONGODB_URI, tz_aware=False)
    store.set_client(loader)
    try:
        return _populate(total, expired_fraction)
    finally:
        store.set_client(None)
        loader.close()


def _populate(total: int, expired_fraction: float) -> int:
    from leases.pods import leases as pod_leases
    from leases.store import client as store, entries

    store.holders().delete_many({})
    store.counters().delete_many({})
    store.pods().delete_many({})
    for i in range(PODS):
        pod_leases.register(f"bench-pod-{i}", f"http://127.0.0.1:{20000 + i}", proposed_interval=60)
    now = store.server_now()
    expired = int(total * expired_fraction)
    booked: dict[str, list[str]] = {}
    batch = []
    for i in range(total):
        user_key = f"bench|user|t1/u{i % USERS}"
        levels = [user_key, "bench|global|*"]
        for key in levels:  # the counters list their bookings, as the engine writes them
            booked.setdefault(key, []).append(entries.entry("t1", "p1", f"u{i % USERS}", f"benchtoken{i:012d}"))
        expires = now - timedelta(seconds=5) if i < expired else now + timedelta(hours=1)
        batch.append({"_id": f"benchtoken{i:012d}", "state": "HELD", "resource": "bench", "leaseName": "bench",
                      "type": "bench", "tenantId": "t1", "projectId": "p1", "userId": f"u{i % USERS}",
                      "holderRef": "", "pod": f"bench-pod-{i % PODS}", "podBound": True, "ttlSeconds": 60,
                      "keys": levels, "levels": levels, "payload": {}, "acquiredAt": now, "lastSeenAt": now, "expiresAt": expires})
        if len(batch) >= BATCH:
            store.holders().insert_many(batch, ordered=False)
            batch = []
    if batch:
        store.holders().insert_many(batch, ordered=False)
    old = now - timedelta(hours=1)
    counters = [{"_id": key, "resource": "bench", "level": key.split("|")[1], "scope": key.split("|")[2],
                 "tenantId": None if key.endswith("|*") else "t1", "count": len(entries), "holders": entries,
                 "cap": total, "updatedAt": old}
                for key, entries in booked.items()]
    for start in range(0, len(counters), BATCH):
        store.counters().insert_many(counters[start:start + BATCH], ordered=False)
    return expired


def measure(fn):
    """Run ``fn`` on a monitored client; returns (result, seconds, command tally)."""
    import pymongo
    from django.conf import settings

    from leases.store import client as store

    counter = CommandCounter()
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[counter], tz_aware=False, timeoutMS=600000)
    store.set_client(client)
    try:
        store.ensure_indexes(client[store.database_name()])
        counter.names.clear()
        started = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - started
    finally:
        store.set_client(None)
        client.close()
    return result, elapsed, Tally(counter.names)


def full_sweep(**kwargs):
    from leases.upkeep import sweeps

    done = rounds = 0
    has_more = True
    while has_more:
        step, has_more = sweeps.sweep(**kwargs)
        done += step
        rounds += 1
    return done, rounds


def bench_sizes(sizes: list[int], round_limit: int) -> list[str]:
    from leases.revocation import listener
    from leases.upkeep import sweeps

    register_bench_handler()
    listener.set_listener(None)  # measure the sweep, not handler dispatch (logged only)
    rows = ["| holders | expired | sweep round: reaped | time | commands | commands / reaped | "
            "sweep, nothing expired: time | commands | reconcile: time | commands |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for total in sizes:
        t0 = time.perf_counter()
        expired = populate(total)
        print(f"  populated {total} holders in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        (reaped, _), sweep_s, sweep_cmds = measure(lambda: sweeps.sweep(limit=round_limit, reconcile_counters=False))
        # Un-expire the rest (reaping them all would only repeat the measured round), so the
        # next measurement sees nothing expired.
        from leases.store import client as store

        measure(lambda: store.holders().update_many({"expiresAt": {"$lt": store.server_now()}},
                                                    {"$set": {"expiresAt": store.server_now() + timedelta(hours=1)}}))
        _, idle_s, idle_cmds = measure(lambda: sweeps.sweep(reconcile_counters=False))
        _, rec_s, rec_cmds = measure(lambda: sweeps.reconcile(safety_ms=0))
        n = sum(sweep_cmds.values())
        rows.append(f"| {total:,} | {expired:,} | {reaped:,} | {sweep_s * 1000:.0f} ms | {n} | "
                    f"{(n - sum(idle_cmds.values())) / max(reaped, 1):.2f} | {idle_s * 1000:.0f} ms | "
                    f"{sum(idle_cmds.values())} | {rec_s * 1000:.0f} ms | {sum(rec_cmds.values())} |")
        print(rows[-1], file=sys.stderr)
        print(f"  {total}: sweep commands {dict(sweep_cmds)}; idle {dict(idle_cmds)}; reconcile {dict(rec_cmds)}",
              file=sys.stderr)
    return rows


POD_CHILD = """
import sys, time, django
django.setup()
import leases
from leases.definitions import layers as config
from leases.revocation import handlers
from leases.pods import renewer as pod_renewer
from leases.definitions.model import document_path
class H(handlers.LeaseHandler):
    type = "bench"
    def on_revoked(self, holder): pass
handlers.register_handler(H())
pod_renewer.start_pod("http://127.0.0.1:1")
held = [leases.acquire(leases.LeaseRequest(type="bench", lease="benchkill", tenant_id="t1", project_id="p1",
                                          user_id=f"u{i}", pod_bound=i % 2 == 0)) for i in range(4)]
print("READY", flush=True)
while True:
    time.sleep(1)
"""


def bench_kill(interval: int, factor: int, reap_interval: float) -> list[str]:
    """kill -9 a pod holding 4 leases; sweep every ``reap_interval`` s (as beat would)."""
    from django.conf import settings

    from leases.definitions import layers as config
    from leases.definitions.model import document_path
    from leases.store import client as store
    from leases.upkeep import sweeps

    config.put_document("_vance", "_tenant", document_path("benchkill"),
                        "levels: {global: 100, user: 1}\nttlSeconds: 600\nwaitMs: 0")
    env = dict(os.environ, POD_ID="bench-victim", LEASES_POD_INTERVAL_SECONDS=str(interval),
               LEASES_POD_INTERVAL_MIN="1", LEASES_POD_EXPIRY_FACTOR=str(factor), LEASES_POD_AUTOSTART="0",
               MONGODB_URI=settings.MONGODB_URI, MONGODB_DB=store.database_name(), PYTHONPATH=REPO,
               DJANGO_SETTINGS_MODULE="config.settings", DJANGO_LOG_LEVEL="ERROR")
    measure(lambda: store.holders().delete_many({}))  # measure detection, not the holder table size
    rows = []
    samples = []
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", POD_CHILD], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(interval * 1.5)  # let it renew at least once
        killed = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        while store.holders().count_documents({"pod": "bench-victim"}):
            sweeps.sweep(reconcile_counters=False)
            time.sleep(reap_interval)
        samples.append(time.monotonic() - killed)
    bound = interval * factor + reap_interval
    rows.append("| pod interval | expiry factor | reap interval | kill -9 → slots free (3 runs) | configured bound |")
    rows.append("|---:|---:|---:|---|---:|")
    rows.append(f"| {interval} s | {factor} | {reap_interval:g} s | {', '.join(f'{s:.2f} s' for s in samples)} | "
                f"{bound:g} s (interval×factor + reap interval, + one sweep's duration) |")
    rows.append("| 10 s | 3 | 30 s | (defaults, not run) | 60 s |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--round-limit", type=int, default=100,
                        help="holders one measured sweep round may reap (the sweep's bound)")
    args = parser.parse_args()
    setup("bench_sweep")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print("## Sweep cost (1% expired; 20 live pods; 2 levels per holder)\n")
    print("\n".join(bench_sizes(sizes, args.round_limit)))
    print("\n## Pod death → slots free\n")
    print("\n".join(bench_kill(interval=1, factor=2, reap_interval=1.0)))


if __name__ == "__main__":
    main()
