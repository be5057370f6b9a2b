"""Shares and classes of a resource: what a waiting ticket carries, and who may set them.

Where they live: the weights and classes are fields of the lease definition (four YAML
layers, field ownership: tenant weights, classes, who may use them and the starvation
bound in the System layer; project weights up to the Tenant layer). At enqueue, the
waiter resolves its own tenant's weight ``wt``, its project's weight ``wp``, its class
rank ``pc`` (0 highest) and name ``pn`` and the starvation bound ``ms`` into its ticket;
the share accounting (passes) lives in the gate counter (``vt``, ``vf``) and is charged by
the grant's own booking update. So the order rule (``leases.queue.order``) is pure over the gate
document and the hand-off path reads nothing more.

The operator edits of weights (tenants: System layer; projects: Tenant layer) rewrite the
layer's YAML through ``leases.definitions.layers`` (validated, invalidation published) and write an
audit record.
"""

from __future__ import annotations

from typing import Any

import pymongo.errors
import yaml

from ..definitions.model import MAX_WEIGHT, SYSTEM_TENANT, TENANT_PROJECT, LeaseDefinition, document_path
from ..errors import InvalidLeaseRequest, LeaseUnavailable
from ..ids.validation import entity_id, lease_name
from ..revocation import audit
from ..store import client as store
from ..store.documents import TicketDoc
from ..telemetry import metrics


def ticket_fields(definition: LeaseDefinition, request: Any, priority: tuple[int, str | None]) -> TicketDoc:
    """The order-rule fields of a waiting ticket of ``request`` under ``definition``."""
    rank, name = priority
    fields: TicketDoc = {"wt": definition.tenant_weight(request.tenant_id),
                              "wp": definition.project_weight(request.project_id), "pc": rank}
    if name is not None:
        fields["pn"] = name
    if definition.max_starvation_ms is not None:
        fields["ms"] = int(definition.max_starvation_ms)
    return fields


def observe_wait(definition: LeaseDefinition, priority: str | None, seconds: float) -> None:
    """Record one queued wait in the per-class histogram. Never raises."""
    label = priority if priority in definition.priorities else "none"
    metrics.WAIT_BY_CLASS.labels(resource=metrics.resource_tag(definition.resource), priority=label).observe(seconds)


def _weight(value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_WEIGHT:
        raise InvalidLeaseRequest(f"weight must be a positive number up to {MAX_WEIGHT}, got {value!r}")
    return int(value) if float(value).is_integer() else float(value)


def _layer_text(tenant_id: str, project_id: str, name: str) -> dict[str, Any]:
    try:
        doc = store.config_documents().find_one(
            {"tenantId": tenant_id, "projectId": project_id, "path": document_path(name)}, {"text": 1})
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("config store", exc)) from None
    if doc is None:
        return {}
    parsed = yaml.safe_load(doc.get("text") or "") or {}
    if not isinstance(parsed, dict):
        raise LeaseUnavailable(f"lease {name}: stored layer of {tenant_id}/{project_id} is not a mapping")
    return parsed


def _set_weight(tenant_id: str, name: str, part: str, key: str, weight: float | None, *, acting_user: Any,
                action: str) -> dict[str, float]:
    from ..definitions import layers as config

    actor = audit.actor_name(acting_user)
    doc = _layer_text(tenant_id, TENANT_PROJECT, name)
    shares = dict(doc.get("shares") or {})
    weights = dict(shares.get(part) or {})
    before = weights.get(key)
    if weight is None:
        weights.pop(key, None)
    else:
        weights[key] = weight
    if weights:
        shares[part] = weights
    else:
        shares.pop(part, None)
    if shares:
        doc["shares"] = shares
    else:
        doc.pop("shares", None)
    config.put_document(tenant_id, TENANT_PROJECT, document_path(name), yaml.safe_dump(doc, sort_keys=False))
    # The record belongs to the tenant whose share changed, so its admins see it too.
    try:
        audit.record(action, actor=actor, tenantId=key if part == "tenants" else tenant_id, lease=name, key=key,
                     before=before, after=weight)
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("audit store", exc)) from None
    return weights


def set_tenant_weight(name: str, tenant_id: str, weight: Any, *, acting_user: Any) -> dict[str, float]:
    """Set (or, with ``weight=None``, remove) a tenant's weight on lease ``name`` in the
    System layer; audited. Returns the lease's tenant weights after.

    Raises:
        InvalidLeaseRequest: a bad lease name, tenant id or weight; nothing is written.
        InvalidDefinition: the System layer would no longer load; nothing is written.
        LeaseUnavailable: the store is unreachable.
    """
    lease_name(name)
    entity_id(tenant_id, "tenant id")
    return _set_weight(SYSTEM_TENANT, name, "tenants", tenant_id, None if weight is None else _weight(weight),
                       acting_user=acting_user, action="tenant-weight")


def set_project_weight(tenant_id: str, name: str, project_id: str, weight: Any, *,
                       acting_user: Any) -> dict[str, float]:
    """Set (or remove) a project's weight within ``tenant_id``'s share on lease ``name`` in
    the tenant's Tenant layer; audited. Returns the tenant's project weights after.

    Raises:
        InvalidLeaseRequest: a bad id, lease name or weight; nothing is written.
        InvalidDefinition: the Tenant layer would no longer load; nothing is written.
        LeaseUnavailable: the store is unreachable.
    """
    lease_name(name)
    entity_id(tenant_id, "tenant id")
    entity_id(project_id, "project id")
    if tenant_id.startswith("_"):
        raise InvalidLeaseRequest("project weights belong to a tenant, not to a reserved layer id")
    return _set_weight(tenant_id, name, "projects", project_id, None if weight is None else _weight(weight),
                       acting_user=acting_user, action="project-weight")


def tenant_weights() -> list[dict[str, Any]]:
    """Every tenant weight set in the System layer: ``{lease, tenant, weight}`` rows.

    Raises:
        LeaseUnavailable: the store is unreachable or a stored layer does not parse.
    """
    rows = []
    try:
        docs = list(store.config_documents().find({"tenantId": SYSTEM_TENANT, "projectId": TENANT_PROJECT},
                                                  {"path": 1, "text": 1}))
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("config store", exc)) from None
    for doc in sorted(docs, key=lambda d: d.get("path", "")):
        name = str(doc.get("path", "")).rsplit("/", 1)[-1].removesuffix(".yaml")
        try:
            parsed = yaml.safe_load(doc.get("text") or "") or {}
        except yaml.YAMLError:
            raise LeaseUnavailable(f"lease {name}: System layer does not parse") from None
        for tenant, weight in sorted(((parsed.get("shares") or {}).get("tenants") or {}).items()):
            rows.append({"lease": name, "tenant": tenant, "weight": weight})
    return rows
