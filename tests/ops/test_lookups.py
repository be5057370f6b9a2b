"""leases.ops.lookups: an operator's typo is "unknown", never answered with defaults."""

from __future__ import annotations

import pytest

from leases.definitions.model import SYSTEM_TENANT, TENANT_PROJECT
from leases.errors import InvalidLeaseRequest, PodNotFound, ProjectNotFound, ResourceNotFound, TenantNotFound
from leases.ops import lookups
from leases.store import client as store
from leases.telemetry import history
from tests.helpers import hold, operator_leases


@pytest.fixture(autouse=True)
def handler():
    with operator_leases() as recording:
        yield recording


def test_given_a_tenant_known_only_by_its_holder_then_it_and_that_project_are_known():
    # given: a tenant the tenancy hook does not list, with one holder in project docs
    hold(tenant="pods-only", project="docs")

    # then: the tenant and that project pass; another project does not
    lookups.require_tenant("pods-only")
    lookups.require_tenant("pods-only", "docs")
    with pytest.raises(ProjectNotFound, match="tenant 'pods-only' has no project 'web'"):
        lookups.require_tenant("pods-only", "web")


def test_given_an_unknown_tenant_then_tenant_not_found_and_the_system_tenant_is_always_known():
    with pytest.raises(TenantNotFound, match="no tenant 'nosuch'"):
        lookups.require_tenant("nosuch", TENANT_PROJECT)
    lookups.require_tenant(SYSTEM_TENANT, "anything")


def test_given_a_pod_then_it_is_known_by_its_registration_or_a_holder_naming_it():
    hold(pod="pod-of-a-holder")
    store.pods().insert_one({"_id": "registered-pod"})

    lookups.require_pod("pod-of-a-holder")
    lookups.require_pod("registered-pod")
    with pytest.raises(PodNotFound, match="unknown pod 'nosuchpod'"):
        lookups.require_pod("nosuchpod")


def test_given_a_resource_then_its_history_scope_is_known_by_history_counter_or_holder():
    hold()  # opres now has counters and a holder
    history.collection().insert_one({"_id": "x", "resource": "hist-only", "tenantId": "gone", "minute": None})

    lookups.require_history_scope("opres", None)
    lookups.require_history_scope("opres", "acme")
    # a tenant that left only history is still known
    lookups.require_history_scope("hist-only", "gone")
    with pytest.raises(ResourceNotFound, match="no resource 'nosuchres'"):
        lookups.require_history_scope("nosuchres", None)
    with pytest.raises(TenantNotFound):
        lookups.require_history_scope("opres", "nosuch")
    with pytest.raises(InvalidLeaseRequest):
        lookups.require_history_scope("opres", "$ne")
