"""Benchmark: acquire + renew + release through the HTTP API vs the in-process service module.

Both paths run against the same MongoDB (``MONGODB_URI``, or an embedded SecantusDB
server started here when it is unset) with N concurrent clients (threads). The HTTP path
goes through gunicorn with several sync workers (the production-style server) and
:class:`leases.client.HttpLeaseClient`; the in-process path calls ``leases.acquire``,
``Lease.check`` and ``Lease.release`` directly. Prints a table and the ratio.

    .venv/bin/python bench/bench_http.py --clients 1,4,8 --workers 4 --seconds 8

Every run is bounded in time and only talks to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TYPE = "tex"  # registered by leases.contrib in every process


def definition() -> dict:
    # Caps far above the client count: the benchmark measures the protocol, not waiting.
    return {"name": "bench", "levels": {"project": 100000, "user": 1000}, "ttlSeconds": 60}


def _run_threads(clients: int, seconds: float, cycle) -> tuple[int, float, list[float]]:
    """Run ``cycle(index)`` in ``clients`` threads for ``seconds``; (cycles, elapsed, latencies)."""
    stop_at = time.monotonic() + seconds
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    start_gate = threading.Barrier(clients + 1)

    def worker(index: int) -> None:
        start_gate.wait()
        try:
            while time.monotonic() < stop_at:
                began = time.perf_counter()
                cycle(index)
                latencies[index].append(time.perf_counter() - began)
        except BaseException as exc:  # report, do not hang the benchmark
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    start_gate.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join(seconds + 60)
    elapsed = time.monotonic() - began
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}") from errors[0]
    flat = [value for per in latencies for value in per]
    return len(flat), elapsed, flat


def bench_http(base_url: str, api_key: str, clients: int, seconds: float):
    from leases.client import HttpLeaseClient

    sessions = [HttpLeaseClient(base_url, api_key, timeout=30) for _ in range(clients)]

    def cycle(index: int) -> None:
        lease = sessions[index].acquire(type=TYPE, inline=definition(), project_id="bench", user_id=f"u{index}")
        lease.renew()
        if not lease.release():
            raise RuntimeError("release did not release")

    try:
        cycle(0)  # warm the worker and the connection
        return _run_threads(clients, seconds, cycle)
    finally:
        for session in sessions:
            session.close()


def bench_inprocess(clients: int, seconds: float):
    import leases

    def cycle(index: int) -> None:
        lease = leases.acquire(leases.LeaseRequest(type=TYPE, inline=definition(), tenant_id="bench",
                                                   project_id="bench", user_id=f"u{index}", pod=""))
        lease.check()
        if not lease.release():
            raise RuntimeError("release did not release")

    cycle(0)
    return _run_threads(clients, seconds, cycle)


def _row(mode: str, clients: int, workers: str, result, requests_per_cycle: int) -> list[str]:
    cycles, elapsed, latencies = result
    rate = cycles / elapsed if elapsed else 0.0
    latencies = sorted(latencies) or [0.0]
    p95 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))]
    return [mode, str(clients), workers, str(cycles), f"{elapsed:.1f}", f"{rate:.1f}",
            f"{rate * requests_per_cycle:.1f}", f"{statistics.median(latencies) * 1000:.1f}", f"{p95 * 1000:.1f}"]


def _print_table(rows: list[list[str]]) -> None:
    header = ["mode", "clients", "workers", "cycles", "seconds", "cycles/s", "requests/s", "p50 ms", "p95 ms"]
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,8", help="comma-separated concurrent client counts")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each measurement")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    if not counts or min(counts) < 1 or max(counts) > 64 or not 1 <= args.workers <= 16 or not 0 < args.seconds <= 120:
        parser.error("clients 1..64, workers 1..16, seconds in (0, 120]")

    with ExitStack() as stack:
        if not os.environ.get("MONGODB_URI"):
            from leases.store.embedded import start_server

            server = stack.enter_context(start_server(":memory:"))
            os.environ["MONGODB_URI"] = server.uri
            store_label = f"embedded SecantusDB (pid {server.pid})"
        else:
            store_label = "MONGODB_URI"
        os.environ.setdefault("MONGODB_DB", "bench_leases")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        os.environ["LEASES_POD_AUTOSTART"] = "0"
        os.environ.setdefault("DJANGO_LOG_LEVEL", "WARNING")
        import django

        django.setup()
        from leases.api import keys
        from leases.store import client as store
        from tests.http_server import running_server

        database = store.db()
        for name in (store.HOLDERS, store.COUNTERS, store.TOMBSTONES, "api_keys"):
            database[name].delete_many({})
        from insights.models import Tenant

        Tenant.objects.get_or_create(slug="bench", defaults={"name": "Bench"})  # keys name existing tenants
        _, api_key = keys.create_key(tenant_id="bench", name="bench", acting_user="bench")
        base_url = stack.enter_context(running_server(workers=args.workers))

        rows: list[list[str]] = []
        ratios: list[str] = []
        for clients in counts:
            http = bench_http(base_url, api_key, clients, args.seconds)
            local = bench_inprocess(clients, args.seconds)
            rows.append(_row("http (gunicorn)", clients, str(args.workers), http, 3))
            rows.append(_row("in-process", clients, "-", local, 3))
            http_rate = http[0] / http[1]
            local_rate = local[0] / local[1]
            ratios.append(f"{clients} client(s): HTTP reaches {http_rate / local_rate:.2f}x the in-process rate")
        leftover = database[store.HOLDERS].count_documents({})
        print(f"store: {store_label}, database {store.database_name()}; one cycle = acquire + renew + release "
              f"(3 HTTP requests / 3 engine calls); {os.cpu_count()} CPU(s)")
        _print_table(rows)
        for line in ratios:
            print(line)
        print(f"holders left after the runs: {leftover}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
