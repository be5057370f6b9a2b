"""The consumer contract: funnel, busy diagnosis, rollback, release, check, NOOP."""

from __future__ import annotations

import threading
import time

import pymongo
import pytest

import leases
from leases import service
from leases.definitions import model as definitions
from leases.engine import funnel, holders
from leases.errors import LeaseExpired
from leases.queue import waiting
from leases.revocation import handlers
from leases.store import client as store
from leases.upkeep import reaper
from tests import helpers
from tests.helpers import counted_commands, define, lease_request


class RecordingHandler(handlers.LeaseHandler):
    type = "test"

    def __init__(self):
        self.revoked = []

    def on_revoked(self, holder):
        self.revoked.append(holder)


@pytest.fixture(autouse=True)
def handler():
    h = handlers.register_handler(RecordingHandler())
    yield h
    handlers.unregister_handler("test")


put = define
req = lease_request


def counter(key):
    doc = store.counters().find_one({"_id": key})
    return None if doc is None else doc["count"]


def expire_now(token):
    """Age a holder past its TTL on MongoDB's clock (no sleeping, no client clock)."""
    store.holders().update_one({"_id": token}, [{"$set": {"expiresAt": {"$subtract": ["$$NOW", 1000]}}}])


def test_given_caps_on_all_levels_when_acquiring_then_each_level_is_booked_narrow_to_wide():
    put("res", "levels: {global: 5, tenant: 4, project: 3, user: 2}\nttlSeconds: 30")
    lease = leases.acquire(req())
    assert lease.levels == ["res|user|acme/u1", "res|project|acme/p1", "res|tenant|acme", "res|global|*"]
    holder = store.holders().find_one({"_id": lease.token})
    assert holder["state"] == "HELD" and holder["levels"] == lease.levels
    assert holder["expiresAt"] > holder["lastSeenAt"]
    assert [counter(k) for k in lease.levels] == [1, 1, 1, 1]


@pytest.mark.parametrize("level,cap_yaml,vary", [
    ("user", "user: 1", dict(project="p2")),            # user scope crosses projects
    ("project", "project: 1", dict(user="u2")),
    ("tenant", "tenant: 1", dict(project="p2", user="u2")),
    ("global", "global: 1", dict(tenant="other", project="p9", user="u9")),
])
def test_given_a_full_level_when_acquiring_then_busy_names_that_level(level, cap_yaml, vary):
    put("res", f"levels: {{{cap_yaml}}}\nwaitMs: 0")
    first = leases.acquire(req())
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(**vary))
    assert busy.value.code == "LEASE_BUSY"
    assert (busy.value.level, busy.value.count, busy.value.cap, busy.value.resource) == (level, 1, 1, "res")
    # Nothing residual: the failed attempt left no holder and no extra count.
    assert store.holders().count_documents({}) == 1
    first.release()
    leases.acquire(req(**vary)).release()


def test_given_user_cap_when_full_then_narrowest_level_is_reported_first():
    put("res", "levels: {global: 1, user: 1}\nwaitMs: 0")
    leases.acquire(req())
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(project="p2"))
    assert busy.value.level == "user"
    # The global counter was never touched by the rejected attempt (user checked first).
    assert counter("res|global|*") == 1


GATE = "res|global|*"


def typical_hold(ms, key=GATE):
    """Give the gate a hold history, as its releases record it (no calibration yet)."""
    store.counters().update_one({"_id": key}, {"$set": {"holds": [float(ms)] * 3}, "$unset": {"er": ""}})


def test_given_no_wait_and_no_hold_on_record_then_busy_suggests_the_floor_not_nothing():
    put("res", "levels: {global: 1}\nwaitMs: 0")
    held = leases.acquire(req(user="h"))
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(user="w"))
    assert busy.value.retry_after == leases.LeaseBusy.DEFAULT_RETRY_AFTER_S == 1.0
    held.release()


def test_given_no_wait_and_a_hold_history_then_busy_suggests_a_newcomers_turn_behind_the_queue():
    put("res", "levels: {global: 1}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    typical_hold(4000)
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(user="n1", wait_ms=0))
    # Behind one holder of cap 1: half a typical hold.
    assert busy.value.retry_after == pytest.approx(2.0)
    waiter = helpers.queue_up(req(user="w", wait_ms=10000), GATE)
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(user="n2", wait_ms=0))
    # The waiter goes first: one hold and a half.
    assert busy.value.retry_after == pytest.approx(6.0) and busy.value.position is None
    held.release()
    waiter.join(10)
    waiter.lease.release()


def test_given_short_holds_on_record_and_a_holder_far_past_them_then_busy_suggests_its_remaining_hold():
    # Given: the gate's recent holds were 3 ms, but the current holder has held 800 ms.
    put("res", "levels: {global: 1}\nwaitMs: 0")
    held = leases.acquire(req(user="h"))
    typical_hold(3)
    time.sleep(0.8)
    # When: a new user asks. Then: the holder is expected to hold about as long again as
    # it has (it is far past the typical hold), not to release within a millisecond.
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(user="new"))
    assert 0.75 <= busy.value.retry_after <= 5.0
    held.release()


def test_given_short_holds_on_record_then_busy_never_suggests_less_than_the_floor(settings):
    # Given: 3 ms holds and a holder that just began: the turnover alone says 1.5 ms.
    put("res", "levels: {global: 1}\nwaitMs: 0")
    held = leases.acquire(req(user="h"))
    typical_hold(3)
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(user="new"))
    # Then: never below the stated floor (a caller that sleeps retry_after must not spin).
    assert busy.value.retry_after == 0.1  # LEASES_RETRY_AFTER_MIN_MS, 100 by default
    settings.LEASES_RETRY_AFTER_MIN_MS = 400
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(user="new"))
    assert busy.value.retry_after == 0.4
    held.release()


def test_given_no_wait_and_a_narrower_level_full_then_busy_suggests_the_floor():
    put("res", "levels: {global: 9, user: 1}\nwaitMs: 0")
    held = leases.acquire(req())
    typical_hold(4000)  # the gate's, but the user level's counter is what the attempt read
    with pytest.raises(leases.LeaseBusy) as busy:
        leases.acquire(req(project="p2"))
    assert busy.value.level == "user" and busy.value.retry_after == 1.0
    held.release()


def test_given_a_kept_ticket_lost_then_busy_suggests_a_newcomers_turn(monkeypatch):
    put("res", "levels: {global: 1}\nwaitMs: 10000")
    held = leases.acquire(req(user="h"))
    typical_hold(4000)
    real = waiting.keep_alive

    def lose_kept(gate_key, ticket_id, *, ttl_ms=None, live_at=None):
        if ttl_ms is not None:  # keeping the ticket for the poller: it is gone meanwhile
            return None
        return real(gate_key, ticket_id, ttl_ms=ttl_ms, live_at=live_at)

    monkeypatch.setattr(waiting, "keep_alive", lose_kept)
    with pytest.raises(leases.LeaseBusy) as busy:
        service.acquire_or_ticket(req(user="w", wait_ms=100), keep_ms=10000)
    assert busy.value.retry_after == pytest.approx(2.0)
    held.release()


def test_given_a_kept_ticket_when_the_system_layer_withdraws_its_class_then_it_keeps_its_class_and_is_granted():
    put("res", "levels: {global: 1}\nwaitMs: 10000\npriorities: [interactive, batch]")
    held = leases.acquire(req(user="h"))
    ticket = service.acquire_or_ticket(req(user="w", wait_ms=0, priority="interactive"), keep_ms=10000)
    assert isinstance(ticket, service.Ticket)
    # when: the System layer no longer lets acme use "interactive" (a new request would be refused)
    put("res", "levels: {global: 1}\nwaitMs: 10000\npriorities: [interactive, batch]\n"
               "allowedPriorities: {acme: [batch]}")
    with pytest.raises(leases.PriorityNotAllowed):
        leases.acquire(req(user="x", wait_ms=0, priority="interactive"))
    # then: the ticket already waiting is not stranded: a poll keeps it, with its class
    assert isinstance(service.resume(ticket.id, scope={"tenantId": "acme"}, keep_ms=10000), service.Ticket)
    held.release()
    lease = service.resume(ticket.id, scope={"tenantId": "acme"}, keep_ms=10000)
    assert isinstance(lease, service.Lease)
    assert store.holders().find_one({"_id": lease.token})["priority"] == "interactive"
    lease.release()


def test_given_cap_one_then_the_lease_is_exclusive_until_released():
    put("res", "levels: {project: 1}\nwaitMs: 0")
    with leases.acquire(req()) as lease:
        assert not lease.is_noop
        with pytest.raises(leases.LeaseBusy):
            leases.acquire(req(user="u2"))
    assert counter("res|project|acme/p1") == 0
    leases.acquire(req(user="u2"))


def test_given_a_wait_when_the_slot_frees_then_the_waiter_gets_it():
    put("res", "levels: {project: 1}\nwaitMs: 3000")
    lease = leases.acquire(req())
    threading.Timer(0.3, lease.release).start()
    started = time.monotonic()
    second = leases.acquire(req(user="u2"))
    assert 0.2 < time.monotonic() - started < 3.0
    second.release()


def test_given_a_wait_when_it_stays_full_then_busy_after_wait_and_not_forever():
    put("res", "levels: {project: 1}\nwaitMs: 400")
    leases.acquire(req())
    started = time.monotonic()
    with pytest.raises(leases.LeaseBusy):
        leases.acquire(req(user="u2"))
    assert 0.35 < time.monotonic() - started < 2.0


@pytest.mark.parametrize("wait_yaml, asked_ms, low, high", [
    ("", 3000, 0.0, 0.3),            # no waitMs (default 0): a longer request wait does not add one
    ("waitMs: 300\n", 3000, 0.25, 1.5),  # the definition's waitMs is the ceiling
    ("waitMs: 3000\n", 0, 0.0, 0.3),     # a request may shorten it
])
def test_given_a_request_wait_then_it_only_shortens_the_definitions_wait(wait_yaml, asked_ms, low, high):
    """LeaseRequest.wait_ms is min()-ed with the definition's waitMs (docs: Waiting and fairness)."""
    put("res", "levels: {project: 1}\n" + wait_yaml)
    leases.acquire(req())
    started = time.monotonic()
    with pytest.raises(leases.LeaseBusy):
        leases.acquire(req(user="u2", wait_ms=asked_ms))
    assert low <= time.monotonic() - started < high


def test_given_store_error_mid_funnel_then_rollback_leaves_no_residue(monkeypatch):
    from leases.queue import slots

    put("res", "levels: {global: 5, tenant: 5, project: 5, user: 5}")
    real = slots.take

    def failing(specs, booking, resource, **kw):
        # user and project booked, then the store fails before the answer arrives
        real([s for s in specs if s.level in ("user", "project")], booking, resource, **kw)
        raise pymongo.errors.AutoReconnect("injected")

    monkeypatch.setattr(slots, "take", failing)
    with pytest.raises(leases.LeaseUnavailable):
        leases.acquire(req())
    assert store.holders().count_documents({}) == 0
    assert counter("res|user|acme/u1") == 0 and counter("res|project|acme/p1") == 0


def test_given_store_error_after_the_last_booking_then_rollback_returns_every_level(monkeypatch):
    put("res", "levels: {tenant: 5, project: 5}")
    holders = store.holders()
    real = type(holders).find_one_and_update

    def failing(self, flt, update, *a, **kw):
        if self.name == store.HOLDERS and isinstance(update, list) and update[0]["$set"].get("state") == "HELD":
            raise pymongo.errors.NetworkTimeout("injected after the bookings")
        return real(self, flt, update, *a, **kw)

    monkeypatch.setattr(type(holders), "find_one_and_update", failing)
    with pytest.raises(leases.LeaseUnavailable):
        leases.acquire(req())
    monkeypatch.undo()
    assert store.holders().count_documents({}) == 0
    assert counter("res|project|acme/p1") == 0 and counter("res|tenant|acme") == 0


def test_release_is_idempotent_and_counts_once():
    put("res", "levels: {project: 2}")
    a = leases.acquire(req())
    b = leases.acquire(req(user="u2"))
    assert a.release() is True
    assert a.release() is False
    assert service.release_token(a.token) is False
    assert counter("res|project|acme/p1") == 1
    b.release()
    assert counter("res|project|acme/p1") == 0


def test_check_extends_the_ttl_on_server_time():
    put("res", "levels: {project: 1}\nttlSeconds: 30")
    lease = leases.acquire(req())
    before = store.holders().find_one({"_id": lease.token})
    time.sleep(0.05)
    lease.check()
    after = store.holders().find_one({"_id": lease.token})
    assert after["lastSeenAt"] > before["lastSeenAt"]
    assert after["expiresAt"] > before["expiresAt"]
    assert (after["expiresAt"] - after["lastSeenAt"]).total_seconds() == pytest.approx(30, abs=0.01)


def test_given_an_idle_holder_when_its_ttl_passes_then_it_is_reaped_and_check_raises_lost(handler):
    put("res", "levels: {project: 1}\nttlSeconds: 1\nwaitMs: 0")
    stale = leases.acquire(req(holder_ref="crashed"))
    expire_now(stale.token)
    # The next acquisition's lazy reap returns the slot without any scheduled sweep.
    fresh = leases.acquire(req(user="u2"))
    assert counter("res|project|acme/p1") == 1
    with pytest.raises(leases.LeaseLost) as lost:
        stale.check()
    # The answer every path gives for a reaped token: EXPIRED with the tombstone's reason.
    assert lost.value.code == "EXPIRED" and lost.value.reason == "idle"
    with pytest.raises(leases.LeaseLost):
        stale.update_payload({"x": 1})
    fresh.release()


def test_given_a_holder_past_its_deadline_when_checking_then_it_is_not_revived_but_reaped_at_once(handler):
    put("res", "levels: {project: 1}\nttlSeconds: 30")
    from leases.revocation import dispatch
    lease = leases.acquire(req(holder_ref="late"))
    lease.update_payload({"jobId": "J7"})
    expire_now(lease.token)  # past its deadline on MongoDB's clock; no sweep ran yet
    with pytest.raises(LeaseExpired) as expired:
        lease.check()
    assert expired.value.reason == "idle"
    assert store.holders().find_one({"_id": lease.token}) is None
    assert counter("res|project|acme/p1") == 0  # the slot came back with the answer
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "idle"
    assert dispatch.get_dispatcher().drain(10)
    assert [(h.token, h.reason, h.payload) for h in handler.revoked] == [(lease.token, "idle", {"jobId": "J7"})]


def test_given_a_lease_released_in_process_when_renewed_later_then_it_answers_expired_release():
    put("res", "levels: {project: 1}")
    lease = leases.acquire(req())
    assert lease.release() is True
    assert store.tombstones().find_one({"_id": lease.token})["reason"] == "release"
    with pytest.raises(LeaseExpired) as expired:
        holders.renew(lease.token, bound=holders.scope("acme"))
    assert expired.value.reason == "release"


def test_given_a_reaped_holder_with_listener_then_listener_gets_it():
    put("res", "levels: {project: 3}\nttlSeconds: 1")
    got = []

    class L:
        def on_revoked(self, holders):
            got.extend(holders)

    from leases.revocation import listener
    previous = listener.get_listener()
    listener.set_listener(L())
    try:
        lease = leases.acquire(req(holder_ref="job-1"))
        lease.update_payload({"jobId": "J1"})
        expire_now(lease.token)
        assert reaper.reap_idle() == (1, False)
    finally:
        listener.set_listener(previous)
    assert [(h.token, h.reason, h.payload, h.holder_ref) for h in got] == [(lease.token, "idle", {"jobId": "J1"}, "job-1")]


def test_update_payload_keeps_dollar_strings_literal():
    put("res", "levels: {project: 1}")
    lease = leases.acquire(req(holder_ref="$where"))
    lease.update_payload({"jobId": "$gt", "nested": {"a": ["$x", 1]}})
    doc = store.holders().find_one({"_id": lease.token})
    assert doc["payload"] == {"jobId": "$gt", "nested": {"a": ["$x", 1]}}
    assert doc["holderRef"] == "$where"


@pytest.mark.parametrize("bad", [{"$set": 1}, {"a.b": 1}, {"a": {"$gt": 1}}, {"": 1}, {"a": object()}, {"a": "x" * 20000}, ["x"],
                                 # numbers outside what JSON (Schema) and BSON share
                                 {"n": float("nan")}, {"n": float("inf")}, {"n": -1.3e24}, {"n": [2.0 ** 70]}, {"n": 2 ** 64}])
def test_bad_payloads_are_refused_and_nothing_changes(bad):
    put("res", "levels: {project: 1}")
    lease = leases.acquire(req())
    with pytest.raises(leases.InvalidLeaseRequest):
        lease.update_payload(bad)
    assert store.holders().find_one({"_id": lease.token})["payload"] == {}


def test_numbers_json_and_bson_share_are_kept():
    put("res", "levels: {project: 1}")
    lease = leases.acquire(req())
    lease.update_payload({"n": 1.5, "m": 2.0 ** 40, "k": -(2 ** 63)})
    assert store.holders().find_one({"_id": lease.token})["payload"] == {"n": 1.5, "m": 2.0 ** 40, "k": -(2 ** 63)}


def test_noop_without_lease_or_caps_issues_zero_commands():
    put("nocaps", "ttlSeconds: 10")
    leases.acquire(req(lease="nocaps"))  # warm the cache (the load itself reads the layers)
    from leases.definitions import invalidation
    assert invalidation.wait_listening()
    leases.acquire(req(lease="nocaps"))
    with counted_commands() as counted:
        a = leases.acquire(req(lease=None))
        b = leases.acquire(req(lease="nocaps"))
        for lease in (a, b):
            assert lease is leases.NOOP and lease.is_noop and lease.token is None
            with lease:
                lease.check()
                lease.update_payload({"a": 1})
    assert counted.commands == []


def test_uncontended_command_budget():
    put("res", "levels: {global: 9, tenant: 9, project: 9, user: 9}")
    from leases.definitions import invalidation
    assert invalidation.wait_listening()
    leases.acquire(req()).release()  # counters exist, cache warm
    with counted_commands() as counted:
        lease = leases.acquire(req())
        acquire_cmds = list(counted.commands)
        counted.commands.clear()
        lease.check()
        check_cmds = list(counted.commands)
        counted.commands.clear()
        lease.release()
        release_cmds = list(counted.commands)
    # Holder, every level's conditional push in one ordered bulk, HELD: 3 whatever L (the
    # old funnel took 2L + 1).
    assert acquire_cmds == ["findAndModify", "update", "findAndModify"], acquire_cmds
    # One renewal: it decides on the deadline it replaced, returned by the same command.
    assert check_cmds == ["findAndModify"]
    # The delete first (a plain one: the owner knows its holder; first, so that a holder whose
    # slot went on is never left to renew), the narrower levels in one bulk, the gate (which
    # returns its queue, for the hand-off), then the tombstone (a later renewal answers
    # EXPIRED, as over HTTP).
    assert release_cmds == ["delete", "update", "findAndModify", "update"]


def test_uncontended_command_budget_of_one_level():
    put("one", "levels: {global: 9}")
    from leases.definitions import invalidation
    assert invalidation.wait_listening()
    leases.acquire(req(lease="one")).release()
    with counted_commands() as counted:
        leases.acquire(req(lease="one")).release()
    assert counted.commands == ["findAndModify", "update", "findAndModify", "delete", "findAndModify",
                                "update"]


def test_given_a_step_fails_after_booking_then_the_rollback_deletes_the_holder_with_a_plain_delete(monkeypatch):
    # A findAndModify that finds its document costs the embedded server a scan of the
    # collection (every waiter's holder is in it), and rollbacks come in bursts exactly when
    # the store is slow: the rollback needs nothing of the document, so it sends a delete.
    put("one", "levels: {global: 1}\nwaitMs: 0")
    from leases.definitions import invalidation
    assert invalidation.wait_listening()
    leases.acquire(req(lease="one")).release()

    def fail(name):
        if name == "acquire":
            raise pymongo.errors.NetworkTimeout("lost after the booking")

    monkeypatch.setattr(funnel, "_pause_point", fail)
    with counted_commands() as counted, pytest.raises(leases.LeaseUnavailable):
        leases.acquire(req(lease="one"))
    on_holders = [name for name, target in counted.on if target == store.HOLDERS]
    assert on_holders == ["findAndModify", "delete"], counted.on  # the holder's upsert, the rollback
    assert store.holders().count_documents({}) == 0 and counter("one|global|*") == 0


def test_given_unregistered_type_then_refused_and_nothing_written():
    put("res", "levels: {project: 1}")
    with pytest.raises(leases.UnknownLeaseType) as err:
        leases.acquire(leases.LeaseRequest(type="nope", lease="res", tenant_id="acme", project_id="p1", user_id="u1"))
    assert err.value.code == "UNKNOWN_LEASE_TYPE" and isinstance(err.value, leases.LeaseError)
    assert store.holders().count_documents({}) == 0


def test_store_unreachable_answers_unavailable_within_bounded_time(settings):
    settings.MONGODB_URI = "mongodb://127.0.0.1:9/?directConnection=true"  # nothing listens
    settings.LEASES_MONGO_TIMEOUT_MS = 300
    store.reset()
    definitions.cache.clear()
    try:
        started = time.monotonic()
        with pytest.raises(leases.LeaseUnavailable) as err:
            leases.acquire(req(lease="tex"))
        assert err.value.code == "LEASE_UNAVAILABLE"
        assert time.monotonic() - started < 3.0
    finally:
        store.reset()
