"""Lease history: the in-process aggregator, its one-command flush, the TTL index, the
History tab (tenant-bound) and ``manage.py lease stats``."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from functools import partial
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from pymongo import monitoring

import leases
from insights.models import Membership, Tenant
from leases.definitions import layers as config
from leases.definitions.model import TENANT_PROJECT, document_path
from leases.ops import history as history_query
from leases.revocation import handlers
from leases.store import client as store
from leases.telemetry import history
from leases.upkeep import reaper
from tests.helpers import counted_commands, define, lease_request


class Recording(handlers.LeaseHandler):
    type = "histtest"

    def on_revoked(self, holder):
        pass


@pytest.fixture(autouse=True)
def clean_history():
    handlers.register_handler(Recording())
    history.recorder.aggregator.drain()  # what earlier tests' acquisitions left in this process
    yield
    history.recorder.aggregator.drain()
    handlers.unregister_handler("histtest")


put = define
req = partial(lease_request, lease="hres", lease_type="histtest", pod="")


# --- the aggregator (pure) ----------------------------------------------------------------------

class FakeClock:
    def __init__(self, t=1_800_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_given_events_in_one_minute_when_drained_then_one_cell_holds_them_all():
    clock = FakeClock()
    agg = history.Aggregator(clock=clock)
    for _ in range(3):
        agg.grant("tex2pdf", "acme")
    agg.busy("tex2pdf", "acme")
    agg.wait("tex2pdf", "acme", 0.040, occupancy=2)
    agg.wait("tex2pdf", "acme", 0.300, occupancy=3)
    agg.reap("tex2pdf", "acme", "idle")
    agg.grant("tex2pdf", "globex")
    cells = agg.drain()
    assert len(agg) == 0 and len(cells) == 2
    cell = cells[("tex2pdf", "acme", int(clock.t // 60))]
    assert (cell.grants, cell.busy, cell.waits, cell.peak, cell.reaps) == (3, 1, 2, 3, {"idle": 1})
    assert cell.buckets == {history.bucket_of(40): 1, history.bucket_of(300): 1}
    assert cell.wait_max_ms == pytest.approx(300)


def test_given_the_next_minute_then_a_new_cell_and_free_text_reasons_become_other():
    clock = FakeClock(1_800_000_000.0 - 1_800_000_000.0 % 60)
    agg = history.Aggregator(clock=clock)
    agg.grant("r", "t")
    clock.t += 60
    agg.grant("r", "t")
    agg.reap("r", "t", "revoke; $set")
    cells = agg.drain()
    assert sorted(k[2] for k in cells) == [clock.t // 60 - 1, clock.t // 60]
    assert cells[("r", "t", clock.t // 60)].reaps == {"other": 1}


def test_given_more_cells_than_the_bound_then_the_oldest_minutes_are_dropped():
    clock = FakeClock(0.0)
    agg = history.Aggregator(clock=clock, max_cells=3)
    for minute in range(5):
        clock.t = minute * 60.0
        agg.grant("r", "t")
    assert sorted(k[2] for k in agg.drain()) == [2, 3, 4]


def test_given_a_failed_flush_when_restored_then_cells_merge_with_new_events():
    clock = FakeClock()
    agg = history.Aggregator(clock=clock)
    agg.grant("r", "t")
    agg.wait("r", "t", 0.01, occupancy=1)
    kept = agg.drain()
    agg.grant("r", "t")
    agg.wait("r", "t", 0.02, occupancy=4)
    agg.restore(kept)
    (cell,) = agg.drain().values()
    assert (cell.grants, cell.waits, cell.peak) == (2, 2, 4)


def test_percentiles_come_from_merged_buckets_and_are_capped_at_the_largest_wait():
    buckets: dict[int, int] = {}
    for ms in [3] * 50 + [40] * 45 + [900] * 5:
        b = history.bucket_of(ms)
        buckets[b] = buckets.get(b, 0) + 1
    assert history_query.percentile(buckets, 0.5, 900) <= 5  # half the waits are in the 0-5 ms bucket
    assert 25 < history_query.percentile(buckets, 0.95, 900) <= 50  # the 95th wait is one of the 40 ms ones
    assert 500 < history_query.percentile(buckets, 0.99, 900) <= 900  # inside 500-1000, never above the max
    assert history_query.percentile({}, 0.5) is None


def test_occupancy_counts_the_tenants_entries_on_the_gate_and_never_more_than_it_held():
    gate = {"holders": ["acme/p/u/t1", "acme/p/u/t2", "globex/p/u/t3"]}
    assert history.occupancy_of(gate, "acme") == 2
    # Granted after that read: the freed slot may have been acme's own, so no +1 on top.
    assert history.occupancy_of(gate, "acme", own_token="t9") == 2
    assert history.occupancy_of(gate, "initech") == 0
    assert history.occupancy_of(gate, "initech", own_token="t9") == 1  # it holds its own slot now
    assert history.occupancy_of(None, "acme") is None
    assert history.occupancy_of({"holders": None}, "acme") is None


@pytest.mark.parametrize("bad", ["", "1", "h", "0h", "-1h", "1.5h", "1w", "$gt", "10 m"])
def test_bad_since_is_a_typed_error(bad):
    with pytest.raises(leases.InvalidLeaseRequest):
        history_query.parse_since(bad, default="")


def test_since_is_capped_at_the_retention():
    assert history_query.parse_since("30m") == timedelta(minutes=30)
    assert history_query.parse_since("7d") == timedelta(hours=history.history_hours())


# --- recording through the engine, flushing in one command --------------------------------------

class CollectionListener(monitoring.CommandListener):
    def __init__(self):
        self.seen: list[tuple[str, object]] = []

    def started(self, event):
        self.seen.append((event.command_name, event.command.get(event.command_name)))

    def succeeded(self, event):
        pass

    def failed(self, event):
        pass


def test_acquisitions_send_no_history_command_and_one_flush_writes_them_all_in_one_bulk_command():
    put("hres", "levels: {tenant: 50}\nttlSeconds: 30")
    leases.acquire(req()).release()  # counters exist: the measured acquisitions are uncontended
    history.flush()
    with counted_commands() as counter:
        for n in range(25):
            leases.acquire(req(user=f"u{n % 5}", project=f"p{n % 3}")).release()
        acquire_commands = list(counter.commands)
        counter.commands.clear()
        written = history.flush()
        assert counter.commands == ["update"]  # one bulk_write, whatever the number of grants
    assert written == 1
    assert "update" in acquire_commands and len(acquire_commands) > 25
    doc = store.db()[history.COLLECTION].find_one({"resource": "hres", "tenantId": "acme"})
    assert doc["grants"] == 26  # the warm-up flush and this one added to the same minute
    assert doc["updatedAt"] is not None


def test_the_engine_sends_no_command_to_the_history_collection_per_acquire():
    import pymongo
    from django.conf import settings

    put("hres", "levels: {tenant: 1}\nttlSeconds: 30")
    listener = CollectionListener()
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[listener])
    store.set_client(client)
    try:
        held = leases.acquire(req())
        with pytest.raises(leases.LeaseBusy):
            leases.acquire(req(user="u2", wait_ms=0))
        reaper.reap({"_id": held.token}, "revoke")
        assert not [c for c in listener.seen if c[1] == history.COLLECTION]
        assert history.flush() == 1
        assert [c for c in listener.seen if c[1] == history.COLLECTION] == [("update", history.COLLECTION)]
    finally:
        store.set_client(None)
        client.close()
    doc = store.db()[history.COLLECTION].find_one({"resource": "hres", "tenantId": "acme"})
    assert (doc["grants"], doc["busy"], doc["reaps"]) == (1, 1, {"revoke": 1})


def test_two_processes_buffers_add_up_in_the_same_minute_document():
    clock = FakeClock(store.server_now().timestamp())
    first, second = history.Recorder(), history.Recorder()
    first.aggregator = history.Aggregator(clock=clock)
    second.aggregator = history.Aggregator(clock=clock)
    first.aggregator.grant("merge", "acme")
    first.aggregator.wait("merge", "acme", 0.004, occupancy=2)
    second.aggregator.grant("merge", "acme")
    second.aggregator.wait("merge", "acme", 2.0, occupancy=5)
    second.aggregator.reap("merge", "acme", "pod")
    assert first.flush() == 1 and second.flush() == 1
    (doc,) = store.db()[history.COLLECTION].find({"resource": "merge"})
    assert (doc["grants"], doc["waits"], doc["peak"], doc["reaps"]) == (2, 2, 5, {"pod": 1})
    assert sum(doc["waitBuckets"].values()) == 2
    assert doc["waitMaxMs"] == pytest.approx(2000)


def test_a_waiter_records_its_wait_and_the_tenants_peak_occupancy_at_the_gate():
    put("hres", "levels: {tenant: 2}\nttlSeconds: 30\nwaitMs: 5000")
    first = leases.acquire(req(user="a"))
    leases.acquire(req(user="b"))
    got = []
    waiter = threading.Thread(target=lambda: got.append(leases.acquire(req(user="c"))))
    waiter.start()
    _wait_for_queue("hres|tenant|acme")
    first.release()
    waiter.join(10)
    assert got, "the waiter was not granted"
    history.flush()
    rows = history_query.query("hres", tenant_id="acme", since=timedelta(hours=1), fill=False).rows
    assert len(rows) >= 1
    # c queued for a's slot; whether a and b (uncontended) pass through the queue too is the
    # engine's business, so only c's wait is certain.
    assert 1 <= sum(r.waits for r in rows) <= 3 and sum(r.grants for r in rows) == 3
    assert max(r.peak or 0 for r in rows) == 2  # c saw a and b on the gate; never above the cap of 2
    assert max(r.wait_p95_ms or 0 for r in rows) > 0


def _wait_for_queue(key, timeout=5.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = store.counters().find_one({"_id": key}, {"queue": 1})
        if doc and doc.get("queue"):
            return
        time.sleep(0.02)
    raise AssertionError(f"nobody queued at {key}")


# --- TTL index ----------------------------------------------------------------------------------

def _ttl(database):
    return {i["name"]: i for i in database[history.COLLECTION].list_indexes()}[history.TTL_INDEX]


def test_the_history_collection_has_a_ttl_index_of_the_configured_hours(mongo_db, settings):
    store.ensure_indexes(mongo_db)
    index = _ttl(mongo_db)
    assert dict(index["key"]) == {"updatedAt": 1}
    assert index["expireAfterSeconds"] == 24 * 3600
    settings.LEASES_HISTORY_HOURS = 2
    try:
        store.ensure_indexes(mongo_db)  # an existing index takes the new value
        assert _ttl(mongo_db)["expireAfterSeconds"] == 7200
    finally:
        settings.LEASES_HISTORY_HOURS = 24
        store.ensure_indexes(mongo_db)
    assert _ttl(mongo_db)["expireAfterSeconds"] == 24 * 3600


# --- the History tab ----------------------------------------------------------------------------

def _admin(slug):
    tenant = Tenant.objects.create(slug=slug, name=slug.title())
    user = get_user_model().objects.create_user(f"{slug}-hist-admin", password="pw")
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.ADMIN)
    client = Client()
    client.force_login(user)
    return client


def _record_two_tenants():
    put("hres", "levels: {tenant: 20}\nttlSeconds: 30")
    for n in range(3):
        leases.acquire(req(user=f"a{n}")).release()
    put("hres", "levels: {tenant: 1}\nttlSeconds: 30", tenant="globex")
    held = leases.acquire(req(tenant="globex"))
    for _ in range(7):
        with pytest.raises(leases.LeaseBusy):
            leases.acquire(req(tenant="globex", user="g2", wait_ms=0))
    reaper.reap({"_id": held.token}, "revoke")
    put("gonly", "levels: {tenant: 1}\nttlSeconds: 30", tenant="globex")
    leases.acquire(req(lease="gonly", tenant="globex")).release()
    history.flush()


def test_the_history_tab_shows_the_tenants_own_numbers_and_not_another_tenants():
    acme, globex = _admin("acme"), _admin("globex")
    _record_two_tenants()
    page = acme.get("/t/acme/insights/leases/history?resource=hres")
    assert page.status_code == 200
    html = page.content.decode()
    assert "3 granted" in html and "0 busy" in html and "0 reaped" in html
    assert "7 busy" not in html and "gonly" not in html  # globex's numbers and resources stay out
    assert "<svg" in html and "<title>" in html and "3 granted</title>" in html
    assert "Global peak occupancy" not in html  # operators only
    # Another tenant's resource is not a way in.
    assert acme.get("/t/acme/insights/leases/history?resource=gonly").status_code == 400
    theirs = globex.get("/t/globex/insights/leases/history?resource=hres").content.decode()
    assert "1 granted" in theirs and "7 busy" in theirs and "1 reaped" in theirs and "3 granted" not in theirs
    assert globex.get("/t/acme/insights/leases/history").status_code == 404
    assert acme.get("/t/acme/insights/leases/history?resource=hres&since=nope").status_code == 400
    fragment = acme.get("/t/acme/insights/leases/history?resource=hres&fragment=1").content.decode()
    assert "3 granted" in fragment and "<html" not in fragment


def test_a_superuser_sees_global_occupancy_summed_over_tenants():
    put("hres", "levels: {tenant: 5}\nttlSeconds: 30")
    clock = FakeClock(store.server_now().timestamp())
    rec = history.Recorder()
    rec.aggregator = history.Aggregator(clock=clock)
    rec.aggregator.wait("hres", "acme", 0.01, occupancy=2)
    rec.aggregator.wait("hres", "globex", 0.01, occupancy=3)
    rec.flush()
    client = _admin("acme")
    user = get_user_model().objects.get(username="acme-hist-admin")
    html = client.get("/t/acme/insights/leases/history?resource=hres").content.decode()
    assert "Global peak occupancy" not in html and "peak 2 slots" in html
    user.is_superuser = True
    user.save()
    html = client.get("/t/acme/insights/leases/history?resource=hres").content.decode()
    assert "Global peak occupancy" in html and ": 5 slots</title>" in html


# --- manage.py lease stats --------------------------------------------------------------------

def lease(*args):
    out = StringIO()
    call_command("lease", *args, stdout=out)
    return out.getvalue()


def test_lease_stats_json_gives_minutes_and_totals_per_tenant_and_summed():
    _record_two_tenants()
    mine = json.loads(lease("stats", "hres", "--tenant", "acme", "--since", "30m", "--json"))
    assert mine["tenantId"] == "acme" and mine["totals"]["grants"] == 3 and mine["totals"]["busy"] == 0
    assert len(mine["minutes"]) >= 1 and all(m["grants"] >= 0 for m in mine["minutes"])
    everyone = json.loads(lease("stats", "hres", "--json"))
    assert everyone["tenantId"] is None
    assert (everyone["totals"]["grants"], everyone["totals"]["busy"], everyone["totals"]["reaps"]) == (4, 7, {"revoke": 1})
    text = lease("stats", "hres")
    assert "TOTAL" in text and "REAP-REVOKE" in text


@pytest.mark.parametrize("args, code", [
    (["stats", "hres", "--since", "soon"], "INVALID_REQUEST"),
    (["stats", "no-such-resource"], "RESOURCE_NOT_FOUND"),
    (["stats", "hres", "--tenant", "nobody-here"], "TENANT_NOT_FOUND"),
])
def test_lease_stats_errors_are_typed(args, code):
    _record_two_tenants()
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("lease", *args, "--json", stdout=out)
    assert json.loads(out.getvalue())["error"]["code"] == code
    assert str(raised.value).startswith(code)


# --- real OS processes: each buffers, flushes from its thread and at exit -------------------------

def test_two_os_processes_add_their_grants_and_busy_answers_to_the_same_minute_documents():
    import subprocess
    import time

    from tests.helpers import PYTHON, REPO, child_env

    config.put_document("_vance", TENANT_PROJECT, document_path("shared"),
                        "levels: {tenant: 1}\nttlSeconds: 30\nwaitMs: 0")
    start_at = time.time() + 1.0
    children = [subprocess.Popen([PYTHON, "-m", "tests.workers.cycler", str(i), "30", str(start_at)], cwd=REPO,
                                 env=child_env(LEASES_MONGO_TIMEOUT_MS="30000"), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for i in range(2)]
    stats = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-2000:]
        stats.append(json.loads(out.strip().splitlines()[-1]))
    # Nothing was flushed by this process: the children wrote it (thread or exit flush).
    docs = list(store.db()[history.COLLECTION].find({"resource": "shared"}))
    assert {d["tenantId"] for d in docs} <= {"t1", "t2"}
    assert sum(d["grants"] for d in docs) == sum(s["ok"] for s in stats) > 0
    assert sum(d["busy"] for d in docs) == sum(s["busy"] for s in stats)
    # One document per (tenant, minute), however many processes wrote to it.
    assert len({d["_id"] for d in docs}) == len(docs) <= 2 * 3


def test_minutes_older_than_the_window_are_left_out():
    now = store.server_now().timestamp()
    clock = FakeClock(now - 2 * 3600)
    rec = history.Recorder()
    rec.aggregator = history.Aggregator(clock=clock)
    rec.aggregator.grant("win", "acme")  # two hours ago
    clock.t = now
    rec.aggregator.grant("win", "acme")
    rec.aggregator.grant("win", "acme")
    assert rec.flush() == 2
    assert history_query.query("win", tenant_id="acme", since=timedelta(hours=1)).totals.grants == 2
    assert history_query.query("win", tenant_id="acme", since=timedelta(hours=3)).totals.grants == 3
    assert len(history_query.query("win", tenant_id="acme", since=timedelta(minutes=30)).rows) == 30  # one per minute


def test_given_an_unreachable_store_when_flushing_then_nothing_is_lost_and_the_next_flush_writes_it():
    import pymongo

    from leases.store.embedded import free_port

    rec = history.Recorder()
    rec.aggregator.grant("outage", "acme")
    dead = pymongo.MongoClient(f"mongodb://127.0.0.1:{free_port()}", serverSelectionTimeoutMS=200,
                               connectTimeoutMS=200, timeoutMS=300)
    store.set_client(dead)
    try:
        assert rec.flush() == 0  # no exception into the caller
    finally:
        store.set_client(None)
        dead.close()
    assert len(rec.aggregator) == 1
    rec.aggregator.grant("outage", "acme")
    assert rec.flush() == 1
    assert store.db()[history.COLLECTION].find_one({"resource": "outage"})["grants"] == 2


# --- the flush at exit ----------------------------------------------------------------------

EXITING_CHILD = """
import sys, time
import django
django.setup()
from leases.telemetry import history
for _ in range(3):
    history.grant("res", "acme")
history.busy("res", "acme")  # 4 events buffered; the periodic flush is a minute away
while not history.recorder._synced_at:  # the flusher has started (read the store's clock)
    time.sleep(0.01)
print("recorded", flush=True)
sys.stdin.readline()  # the store goes away meanwhile
"""


def test_given_the_store_gone_before_the_process_exits_then_the_exit_flush_is_bounded_and_says_quietly_what_it_dropped():
    import subprocess
    import time

    from leases.store.embedded import start_server
    from tests.helpers import PYTHON, REPO, child_env

    server = start_server(":memory:")
    try:
        child = subprocess.Popen([PYTHON, "-c", EXITING_CHILD], cwd=REPO, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=child_env(MONGODB_URI=server.uri, LEASES_HISTORY_FLUSH_SECONDS="60",
                                               LEASES_MONGO_TIMEOUT_MS="5000"))
        assert child.stdout.readline().strip() == "recorded"
    finally:
        server.stop()
    # when: the process exits after its store went (a CLI run after the dev stack stopped)
    asked = time.monotonic()
    _, stderr = child.communicate("\n", timeout=60)
    took = time.monotonic() - asked
    # then: it exits within the exit flush's bound (1 s) and pymongo's own shut-down, not after
    # the store timeout (5 s here; the unbounded flush took 11 s), with no
    # warning, and one quiet line says how many events it dropped
    assert child.returncode == 0, stderr
    assert took < 3.0, (took, stderr)
    assert "WARNING" not in stderr and "ERROR" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if "lease history" in line]
    assert len(lines) == 1 and " INFO " in lines[0] and "4 events" in lines[0], stderr
