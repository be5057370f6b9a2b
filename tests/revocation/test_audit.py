"""leases.revocation.audit: one actor rule and one entry shape for revocations and API-key management."""

from __future__ import annotations

import pytest

from leases.api import keys
from leases.errors import AuditEntryNotFound, InvalidLeaseRequest
from leases.ops import actions
from leases.revocation import audit
from leases.store import client as store
from tests.helpers import ensure_tenant, hold, operator_leases


@pytest.fixture
def handler():
    with operator_leases() as recording:
        yield recording


class _User:
    def __init__(self, username):
        self.username = username

    def get_username(self):
        return self.username


@pytest.mark.parametrize("acting_user, name", [("ops", "ops"), (_User("alice"), "alice"), ("x" * 150, "x" * 150)])
def test_given_a_user_or_a_name_then_actor_name_is_its_username(acting_user, name):
    assert audit.actor_name(acting_user) == name


@pytest.mark.parametrize("acting_user", [None, "", "   ", "x" * 151, "a\x00b", 7, _User(""), {"$ne": ""}])
def test_given_no_or_a_malformed_actor_then_a_typed_error(acting_user):
    with pytest.raises(InvalidLeaseRequest):
        audit.actor_name(acting_user)


def test_given_a_record_then_it_is_stored_literally_on_mongodb_time():
    before = store.server_now()
    audit.record("revoke", actor="ops", token="$token", tenantId="acme", reason="$$NOW is not a time here")
    (entry,) = audit.list_entries()
    assert entry["action"] == "revoke" and entry["actor"] == "ops" and entry["tenantId"] == "acme"
    # User-chosen strings stay strings: neither field paths nor variables.
    assert entry["token"] == "$token" and entry["reason"] == "$$NOW is not a time here"
    assert before <= entry["at"] <= store.server_now()


def test_given_a_revocation_and_a_key_creation_then_both_entries_name_their_actor_the_same_way(handler):
    ensure_tenant("acme")
    actions.revoke_holder(hold().token, tenant_id="acme", acting_user=_User("alice"), reason="stuck")
    keys.create_key(tenant_id="acme", name="k", acting_user=_User("alice"))
    entries = {e["action"]: e for e in audit.list_entries("acme")}
    assert set(entries) == {"revoke", "apikey-create"}
    assert {e["actor"] for e in entries.values()} == {"alice"}
    assert all(e["at"] is not None and e["tenantId"] == "acme" for e in entries.values())
    assert [e["action"] for e in audit.list_entries("acme", actions=audit.REVOCATION_ACTIONS)] == ["revoke"]


def test_given_a_long_actor_then_revocation_and_key_management_refuse_it_alike(handler):
    ensure_tenant("acme")
    lease = hold()
    with pytest.raises(InvalidLeaseRequest):
        actions.revoke_holder(lease.token, acting_user="x" * 151)
    with pytest.raises(InvalidLeaseRequest):
        keys.create_key(tenant_id="acme", name="k", acting_user="x" * 151)
    lease.check()
    assert store.audit().count_documents({}) == 0


def test_given_a_revocation_then_its_audit_entry_is_found_by_id_in_its_tenant_only(handler):
    lease = hold()
    actions.revoke_holder(lease.token, tenant_id="acme", acting_user="ops", reason="stuck")
    (entry,) = audit.list_entries("acme")
    assert audit.get_entry(entry["id"], tenant_id="acme")["token"] == lease.token
    with pytest.raises(AuditEntryNotFound):
        audit.get_entry(entry["id"], tenant_id="globex")
    for bad in ({"$ne": ""}, "x" * 24, "abc"):
        with pytest.raises(InvalidLeaseRequest):
            audit.get_entry(bad)
