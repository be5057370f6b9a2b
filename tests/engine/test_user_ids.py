"""User ids are Django usernames and email addresses: accepted, booked and kept apart.

A user id may carry ``.``, ``@``, ``+`` (and, from an email's local part, ``/``, ``|``, ``%``);
each id is encoded where counter keys, scopes and booking entries are built, so two users
never share a counter or an entry, and ids valid before encode to the same keys as before.
"""

from __future__ import annotations

from functools import partial

import pytest

import leases
from leases.errors import InvalidLeaseRequest, LeaseBusy
from leases.ids import validation
from leases.revocation import handlers
from leases.store import client as store, entries
from tests.helpers import define, lease_request

LONGEST = "u" * 140 + ".@+-_x.y.z"  # Django's username limit: 150 characters
assert len(LONGEST) == 150


class _Handler(handlers.LeaseHandler):
    type = "test"

    def on_revoked(self, holder):
        pass


@pytest.fixture(autouse=True)
def handler():
    handlers.register_handler(_Handler())
    yield
    handlers.unregister_handler("test")


_put = define
_req = partial(lease_request, lease="per-user")


@pytest.mark.parametrize("user", ["alice.smith", "bob@example.com", "c+d", LONGEST, "ünïcødé", "o'brien",
                                  "a/b", "x|y", "100%", "$where", "*"])
def test_given_a_django_username_or_email_when_acquiring_then_it_is_held_on_its_own_user_counter(user):
    _put("per-user", "levels: {user: 1}\nttlSeconds: 30")
    lease = leases.acquire(_req(user=user))
    assert not lease.is_noop
    [key] = lease.levels
    held = store.counters().find_one({"_id": key})
    assert held["count"] == 1 and held["level"] == "user"
    # The stored scope reads back as the user; the entry names the same user.
    assert key == "per-user|user|" + held["scope"]
    assert entries.parts_of(held["holders"][0]) == ("acme", "p1", user)
    assert store.holders().find_one({"_id": lease.token})["userId"] == user
    with pytest.raises(LeaseBusy):
        leases.acquire(_req(user=user))
    lease.release()
    assert store.counters().find_one({"_id": key})["count"] == 0


def test_given_names_that_differ_only_in_an_encoded_character_then_each_has_its_own_slot():
    _put("per-user", "levels: {user: 1}\nttlSeconds: 30")
    users = ["a/b", "a%2Fb", "a%252Fb", "a|b", "a%7Cb", "a%b", "a%25b", "a", "a/b/c", "a%2Fb%2Fc"]
    held = [leases.acquire(_req(user=user)) for user in users]  # a shared counter would answer busy
    keys = [lease.levels[0] for lease in held]
    assert len(set(keys)) == len(users)
    for user, key in zip(users, keys):
        doc = store.counters().find_one({"_id": key})
        assert doc["count"] == 1
        assert [entries.parts_of(e) for e in doc["holders"]] == [("acme", "p1", user)]
        assert validation.counter_key(key) == key


def test_given_a_user_id_with_a_separator_then_its_entry_splits_back_into_the_same_ids():
    booking = entries.entry("acme", "p1", "x/y|z%", "tok123")
    assert entries.parts_of(booking) == ("acme", "p1", "x/y|z%")
    assert entries.token_of(booking) == "tok123"


def test_given_ids_valid_before_then_keys_and_entries_are_unchanged():
    _put("all-levels", "levels: {global: 9, tenant: 9, project: 9, user: 9}\nttlSeconds: 30")
    lease = leases.acquire(_req(user="u_1-x", lease="all-levels"))
    assert lease.levels == ["all-levels|user|acme/u_1-x", "all-levels|project|acme/p1",
                            "all-levels|tenant|acme", "all-levels|global|*"]
    assert entries.entry("acme", "p1", "u_1-x", "tok") == "acme/p1/u_1-x/tok"
    lease.release()


@pytest.mark.parametrize("user", ["", LONGEST + "x", "a b", "tab\there", "new\nline", "nul\x00", "zw\u200bsp",
                                  "rtl\u202eevil", "nb\u00a0sp", "lone\ud800", None, 7, {"$ne": ""}])
def test_given_no_username_when_acquiring_then_a_typed_error_and_nothing_is_written(user):
    _put("per-user", "levels: {user: 1}\nttlSeconds: 30")
    with pytest.raises(InvalidLeaseRequest) as caught:
        leases.acquire(_req(user=user))
    assert caught.value.code == "INVALID_REQUEST" and "user id" in str(caught.value)
    assert store.holders().count_documents({}) == 0
    assert store.counters().count_documents({}) == 0


@pytest.mark.parametrize("key", ["r|user|acme/alice%2Fx", "r|user|acme/bob@example.com", "r|user|acme/a%25b"])
def test_given_an_encoded_user_scope_then_counter_key_accepts_it(key):
    assert validation.counter_key(key) == key


@pytest.mark.parametrize("key", ["r|user|acme/a%2x", "r|user|acme/a%b", "r|project|acme/a.b", "r|user|acme/a b",
                                 "r|tenant|ac%2Fme"])
def test_given_a_scope_that_is_no_encoding_then_counter_key_refuses_it(key):
    with pytest.raises(InvalidLeaseRequest):
        validation.counter_key(key)


def test_given_a_user_with_separators_then_the_order_rule_counts_its_slots_as_its_own():
    from leases.queue import order

    held = order.Occupancy.of([entries.entry("acme", "p1", "a/b", "t1"), entries.entry("acme", "p1", "a|b%", "t2")])
    assert held.user[("acme", "a/b")] == 1 and held.user[("acme", "a|b%")] == 1
    assert held.user[("acme", "a")] == 0 and held.project[("acme", "p1")] == 2
    assert not held.fits({"t": "acme", "p": "p1", "u": "a/b", "caps": {"user": 1}})
    assert held.fits({"t": "acme", "p": "p1", "u": "a", "caps": {"user": 1}})


def test_given_an_expired_holder_with_an_email_id_when_swept_then_its_slots_are_returned_and_reconcile_agrees():
    from leases.upkeep import reaper, sweeps

    _put("swept", "levels: {project: 5, user: 1}\nttlSeconds: 30")
    user = "o'brien+tag/x|y%z@example.com"
    lease = leases.acquire(_req(user=user, lease="swept"))
    keep = leases.acquire(_req(user="bob@example.com", lease="swept"))
    store.holders().update_one({"_id": lease.token}, [{"$set": {"expiresAt": {"$subtract": ["$$NOW", 1000]}}}])
    assert reaper.reap_idle(dispatch=False)[0] == 1
    counts = {d["_id"]: d["count"] for d in store.counters().find()}
    assert counts[lease.levels[0]] == 0 and counts[keep.levels[0]] == 1 and counts["swept|project|acme/p1"] == 1
    sweeps.reconcile(safety_ms=0)
    assert {d["_id"]: d["count"] for d in store.counters().find() if d["count"]} == {
        keep.levels[0]: 1, "swept|project|acme/p1": 1}
    assert leases.acquire(_req(user=user, lease="swept")).levels[0] == lease.levels[0]  # its slot is free again


def test_given_a_holder_with_a_separator_in_its_user_then_cli_and_insights_show_the_real_name():
    from io import StringIO

    from django.core.management import call_command

    from insights.templatetags.insights_tags import readable_key

    _put("per-user", "levels: {user: 1}\nttlSeconds: 30")
    lease = leases.acquire(_req(user="ann/x|y%"))
    [key] = lease.levels
    assert key == "per-user|user|acme/ann%2Fx%7Cy%25"
    assert readable_key(key) == "per-user|user|acme/ann/x|y%"
    out = StringIO()
    call_command("lease", "show", lease.token, stdout=out)
    assert "per-user|user|acme/ann/x|y%" in out.getvalue()
    out = StringIO()
    call_command("lease", "counters", stdout=out)
    assert "acme/ann/x|y%" in out.getvalue()
