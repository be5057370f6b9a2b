"""Page benchmark: what each Insights → Leases page costs at 3,000 holders and 500 waiters.

Populates three tenants on three resources: 3,000 holders acquired through the engine
itself (``leases.acquire``, ``wait_ms=0``; every resource's global level ends full), 500
waiting tickets in the gate counters' ``queue`` arrays with their PENDING holder documents
(the shape the engine writes, kept alive by a long ticket TTL), and an hour of history
minutes. Then renders each page for one tenant admin with Django's test client and runs
the operator CLI's ``lease waiters --json`` and ``lease counters``.

Prints a markdown table: per page the median of 5 renders (after one warm-up), the MongoDB
commands of the lease engine's client and the commands of the ORM's own client (sessions,
users, tenants, memberships, projects), both counted exactly with pymongo command
monitoring. Run: ``python bench/bench_pages.py`` (embedded server unless MONGODB_URI is
set). Not a test: it measures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import statistics
import sys
import time
from collections import Counter as Tally
from datetime import UTC, datetime, timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _setup import CommandCounter, register_bench_handler, setup  # noqa: E402

# tenant → (share of the holders and tickets, users); the first one is the viewer.
TENANTS = {"acme": (0.5, 60), "globex": (0.3, 40), "initech": (0.2, 30)}
PROJECTS = 3
RESOURCES = ("pdf", "browser", "build")
PODS = 10
PASSWORD = "bench-pass-123"
TICKET_TTL_MS = 3_600_000  # the tickets stay live for the whole run (nobody keeps them alive)


def _mix(total: int) -> list[str]:
    """``total`` tenant ids in the TENANTS shares, interleaved."""
    out: list[str] = []
    for tenant, (share, _) in TENANTS.items():
        out.extend([tenant] * round(total * share))
    out = out[:total] + [next(iter(TENANTS))] * (total - len(out))
    return [out[(i * 7919) % total] for i in range(total)]  # a fixed shuffle (7919 is prime)


def define(holders: int) -> None:
    """One System-layer definition per resource: the global level is the gate and ends full."""
    from leases.definitions import layers as config
    from leases.definitions.model import TENANT_PROJECT, document_path

    per_resource = holders // len(RESOURCES)
    for name in RESOURCES:
        config.put_document("_vance", TENANT_PROJECT, document_path(name),
                            f"levels: {{global: {per_resource}, tenant: {per_resource}, user: 9}}\n"
                            "ttlSeconds: 86400\nwaitMs: 0")


def acquire_holders(total: int) -> None:
    """``total`` holders through the engine, spread over resources, tenants, projects, users, pods."""
    import leases
    from leases.pods import leases as pod_leases

    for i in range(PODS):
        pod_leases.register(f"bench-pod-{i}", f"http://127.0.0.1:{20000 + i}", proposed_interval=60)
    tenants = _mix(total // len(RESOURCES))
    started = time.perf_counter()
    refused = 0
    for r, resource in enumerate(RESOURCES):
        seen: Tally = Tally()
        for i, tenant in enumerate(tenants):
            n = seen[tenant]  # users of a tenant take turns, so none exceeds the user cap
            seen[tenant] += 1
            try:
                leases.acquire(leases.LeaseRequest(
                    type="bench", lease=resource, tenant_id=tenant, project_id=f"p{n % PROJECTS}",
                    user_id=f"u{n % TENANTS[tenant][1]}", holder_ref=f"job:{r}-{i}", pod=f"bench-pod-{i % PODS}",
                    pod_bound=False, wait_ms=0))
            except leases.LeaseBusy:
                refused += 1
    print(f"  acquired {total - refused} holders ({refused} refused) in {time.perf_counter() - started:.1f}s",
          file=sys.stderr)


def queue_tickets(total: int) -> None:
    """``total`` waiting tickets in the gates' queues, each with its PENDING holder document,
    in the shape the engine writes (``leases.queue.waiting``, ``leases.service``)."""
    from leases.store import client as store

    now = store.server_now()
    tenants = _mix(total)
    for r, resource in enumerate(RESOURCES):
        gate = f"{resource}|global|*"
        sample = store.holders().find_one({"resource": resource, "state": "HELD"}, {"ttlSeconds": 1, "keys": 1})
        order = [key.split("|")[1] for key in sample["keys"]]  # the engine's order, narrow → wide
        cap = int(store.counters().find_one({"_id": f"{resource}|tenant|{tenants[0]}"})["cap"])
        tickets, pending = [], []
        for i in range(r, total, len(RESOURCES)):
            tenant = tenants[i]
            project, user = f"p{i % PROJECTS}", f"u{i % TENANTS[tenant][1]}"
            token = secrets.token_urlsafe(24)
            arrived = now - timedelta(seconds=total - i)
            scope = {"user": f"{tenant}/{user}", "tenant": tenant, "global": "*"}
            keys = [f"{resource}|{level}|{scope[level]}" for level in order]
            tickets.append({"id": token, "t": tenant, "p": project, "u": user, "at": arrived, "seen": now,
                            "ttl": TICKET_TTL_MS, "caps": {"user": 9, "tenant": cap}, "lvl": "global"})
            pending.append({"_id": token, "state": "PENDING", "resource": resource, "leaseName": resource,
                            "type": "bench", "tenantId": tenant, "projectId": project, "userId": user,
                            "holderRef": f"job:w{i}", "pod": f"bench-pod-{i % PODS}", "podBound": False,
                            "ttlSeconds": sample["ttlSeconds"], "keys": keys, "levels": [], "payload": {},
                            "acquiredAt": arrived, "lastSeenAt": arrived,
                            "expiresAt": arrived + timedelta(seconds=sample["ttlSeconds"])})
        store.holders().insert_many(pending, ordered=False)
        store.counters().update_one({"_id": gate}, {"$push": {"queue": {"$each": tickets}},
                                                    "$currentDate": {"clock": True}})


def record_history(minutes: int) -> None:
    """Flush what the engine recorded (the grants above), plus ``minutes`` earlier minutes
    per tenant and resource in the shape ``leases.telemetry.history`` writes."""
    from leases.store import client as store
    from leases.telemetry import history

    history.flush()
    now = store.server_now()
    current = int(now.replace(tzinfo=UTC).timestamp()) // 60
    docs = []
    for tenant in TENANTS:
        for resource in RESOURCES:
            for m in range(1, minutes + 1):
                minute = current - m
                docs.append({"_id": history.doc_id(resource, tenant, minute), "resource": resource,
                             "tenantId": tenant, "minute": datetime.fromtimestamp(minute * 60, UTC).replace(tzinfo=None),
                             "grants": 40 + m % 7, "busy": m % 5, "waits": 6 + m % 4,
                             "waitBuckets": {"3": 2, "6": 3, "8": 1 + m % 4}, "waitMaxMs": 2200.0 + m,
                             "peak": 480 + m % 20, "reaps": {"idle": m % 3}, "updatedAt": now})
    coll = store.db()[history.COLLECTION]
    recorded = {d["_id"] for d in coll.find({}, {"_id": 1})}  # the minutes the acquisitions above fell in
    coll.insert_many([d for d in docs if d["_id"] not in recorded], ordered=False)


class TimedCounter(CommandCounter):
    """Command names plus the time the server took for them (round trip, as pymongo sees it)."""

    def __init__(self) -> None:
        super().__init__()
        self.micros = 0

    def succeeded(self, event) -> None:
        self.micros += event.duration_micros

    def failed(self, event) -> None:
        self.micros += event.duration_micros


def tenant_admin():
    """The viewer: acme's admin, with projects, as ``seed_demo`` creates them."""
    from django.contrib.auth import get_user_model

    from insights.models import Membership, Project, Tenant

    user, _ = get_user_model().objects.get_or_create(username="acme-admin")
    user.set_password(PASSWORD)
    user.save()
    for slug in TENANTS:
        tenant, _ = Tenant.objects.update_or_create(slug=slug, defaults={"name": slug.title()})
        for p in range(PROJECTS):
            Project.objects.get_or_create(tenant=tenant, slug=f"p{p}", defaults={"name": f"P{p}"})
    Membership.objects.update_or_create(user=user, tenant=Tenant.objects.get(slug="acme"),
                                        defaults={"role": Membership.Role.ADMIN})
    return user


def measure(fn, engine: TimedCounter, orm: TimedCounter, runs: int):
    """One warm-up, then ``runs`` calls: median ms, median ms spent in MongoDB commands
    (both clients), the commands of the last call, and its result."""
    result = fn()
    times, in_db = [], []
    for _ in range(runs):
        engine.names.clear()
        orm.names.clear()
        engine.micros = orm.micros = 0
        started = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - started) * 1000)
        in_db.append((engine.micros + orm.micros) / 1000)
    return statistics.median(times), statistics.median(in_db), Tally(engine.names), Tally(orm.names), result


def _tally(t: Tally) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(t.items())) or "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--holders", type=int, default=3000)
    parser.add_argument("--waiters", type=int, default=500)
    parser.add_argument("--minutes", type=int, default=60, help="history minutes per tenant and resource")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ["LEASES_POD_AUTOSTART"] = "0"  # no pod threads sending commands while we count
    os.environ["LEASES_HISTORY_FLUSH_SECONDS"] = "0"  # flushed explicitly, not by a timer
    os.environ.setdefault("DJANGO_DEBUG", "0")  # production rendering (no debug context)
    setup("bench_pages")
    import pymongo
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections
    from django.test import Client
    from django.test.utils import setup_test_environment

    from leases.store import client as store

    # The ORM's own MongoClient is created on first use from OPTIONS: listen there too.
    orm = TimedCounter()
    connections["default"].settings_dict["OPTIONS"]["event_listeners"] = [orm]
    engine = TimedCounter()
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[engine], tz_aware=False)
    store.set_client(client)
    setup_test_environment()  # the test client's host name
    register_bench_handler()

    started = time.perf_counter()
    call_command("migrate", verbosity=0, interactive=False)
    define(args.holders)
    acquire_holders(args.holders)
    queue_tickets(args.waiters)
    record_history(args.minutes)
    tenant_admin()
    print(f"  populated in {time.perf_counter() - started:.1f}s; ORM client saw {len(orm.names)} commands "
          "(0 would mean the listener missed the ORM's client)", file=sys.stderr)

    web = Client()
    if not web.login(username="acme-admin", password=PASSWORD):
        raise SystemExit("login failed")
    base = "/t/acme/insights/leases"
    pages = [
        ("Holders (page 1 of 50 per page)", base),
        ("Counters", f"{base}/counters"),
        ("Waiting", f"{base}/waiting"),
        ("History (1 h, first resource)", f"{base}/history"),
        ("Definition (pdf, project p0)", f"{base}/definition?name=pdf&project=p0"),
    ]
    rows = ["| what | median ms (5) | of which in MongoDB commands | engine commands | engine commands by name "
            "| ORM commands | size |",
            "|---|---:|---:|---:|---|---:|---:|"]
    for label, url in pages:
        ms, db_ms, eng, orm_cmds, response = measure(lambda url=url: web.get(url), engine, orm, args.runs)
        if response.status_code != 200:
            print(f"  {label}: HTTP {response.status_code}", file=sys.stderr)
        rows.append(f"| {label} | {ms:.0f} | {db_ms:.0f} | {sum(eng.values())} | {_tally(eng)} | {sum(orm_cmds.values())} "
                    f"({_tally(orm_cmds)}) | {len(response.content) / 1024:.0f} KiB |")
        print(rows[-1], file=sys.stderr)
    for label, argv in (("`lease waiters --json`", ("waiters", "--json")), ("`lease counters`", ("counters",))):
        def run(argv=argv):
            out = io.StringIO()
            call_command("lease", *argv, stdout=out)
            return out.getvalue()
        ms, db_ms, eng, orm_cmds, text = measure(run, engine, orm, args.runs)
        rows.append(f"| {label} | {ms:.0f} | {db_ms:.0f} | {sum(eng.values())} | {_tally(eng)} | {sum(orm_cmds.values())} | "
                    f"{len(text) / 1024:.0f} KiB |")
        print(rows[-1], file=sys.stderr)

    shown = sum(1 for t in store.counters().find({"queue.t": "acme"}, {"queue": 1})
                for ticket in t["queue"] if ticket["t"] == "acme")
    print(f"## Page cost: {args.holders:,} holders, {args.waiters:,} waiting tickets "
          f"(acme's own: {shown}), {args.minutes} history minutes per tenant and resource\n")
    print(f"Viewer: acme-admin (acme holds {round(args.holders * TENANTS['acme'][0]):,} of the holders).\n")
    print("\n".join(rows))
    store.set_client(None)
    client.close()


if __name__ == "__main__":
    main()
