"""Existence checks for operator input, so a typo is answered "unknown", not with defaults.

An operator names tenants, projects, pods and resources that may have no document of
their own (a tenant the tenancy hook does not list can still lease). Each check says what
"known" means for that kind of id; all are exact-match queries on validated ids.
"""

from __future__ import annotations

from ..definitions.model import SYSTEM_TENANT, TENANT_PROJECT
from ..errors import PodNotFound, ProjectNotFound, ResourceNotFound, TenantNotFound
from ..ids import validation
from ..store import client as store
from ..telemetry import history
from ..tenancy import tenant_access


def require_tenant(tenant_id: str, project_id: str = TENANT_PROJECT) -> None:
    """Fail unless (tenant, project) is known somewhere.

    Known means: a tenant (project) of the tenancy hook (``LEASES_TENANT_ACCESS``), a stored
    config document or a holder with that id; pods may lease for tenants the hook does not
    list. The System tenant and the tenant-wide project are always known.

    Raises:
        TenantNotFound: the tenant is known nowhere.
        ProjectNotFound: the project is known nowhere in that tenant.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    if tenant_id == SYSTEM_TENANT:
        return
    access = tenant_access()
    listed = access.tenant_exists(tenant_id)
    tenant = {"tenantId": {"$eq": tenant_id}}
    if not listed and not (store.config_documents().find_one(tenant, {"_id": 1})
                           or store.holders().find_one(tenant, {"_id": 1})):
        raise TenantNotFound(f"no tenant {tenant_id!r} (not in Insights, no config document, no holder)")
    if project_id == TENANT_PROJECT:
        return
    scope = {**tenant, "projectId": {"$eq": project_id}}
    if not ((listed and access.project_exists(tenant_id, project_id))
            or store.config_documents().find_one(scope, {"_id": 1}) or store.holders().find_one(scope, {"_id": 1})):
        raise ProjectNotFound(f"tenant {tenant_id!r} has no project {project_id!r} (not in Insights, "
                              f"no config document, no holder)")


def require_pod(pod: str) -> None:
    """Fail unless ``pod`` is registered or named by a holder.

    Raises:
        PodNotFound: no pod registration and no holder names it.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    if (store.pods().find_one({"_id": {"$eq": pod}}, {"_id": 1}) is None
            and store.holders().find_one({"pod": {"$eq": pod}}, {"_id": 1}) is None):
        raise PodNotFound(f"unknown pod {pod!r}: it is not registered and no holder names it")


def require_history_scope(resource: str, tenant_id: str | None) -> None:
    """Fail unless ``resource`` (and ``tenant_id`` when given) can have a history.

    A tenant that left history is known even when its holders and documents are gone; a
    resource is known by its history, a counter or a holder.

    Raises:
        InvalidLeaseRequest: malformed tenant id.
        TenantNotFound: the tenant is known nowhere.
        ResourceNotFound: nothing names the resource.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    if tenant_id is not None:
        validation.entity_id(tenant_id, "tenant id")
        if not history.collection().find_one({"tenantId": {"$eq": tenant_id}}, {"_id": 1}):
            require_tenant(tenant_id, TENANT_PROJECT)
    named = {"resource": {"$eq": resource}}
    if not (history.collection().find_one(named, {"_id": 1})
            or store.counters().find_one(named, {"_id": 1})
            or store.holders().find_one(named, {"_id": 1})):
        raise ResourceNotFound(f"no resource {resource!r} (no history, counter or holder names it)")
