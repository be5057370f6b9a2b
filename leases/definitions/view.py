"""The merged definition of a lease as an acquisition in (tenant, project) sees it, read afresh.

For operators (Insights, the ``lease definition`` command): each field with the layer it
came from. Reading afresh means dropping this process's cache entry for that name first
(:data:`leases.definitions.model.cache`), so a process that is not on the change-event
chain never shows a stale merge; that is the one side effect here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..ids import validation
from . import model as definitions


@dataclass(frozen=True)
class DefinitionField:
    """One field of a merged definition and the layer it came from."""

    field: str
    value: Any
    layer: str


@dataclass(frozen=True)
class DefinitionView:
    """A merged definition as an acquisition in (tenant, project) sees it."""

    name: str
    tenant_id: str
    project_id: str
    resource: str
    noop: bool
    fields: list[DefinitionField] = field(default_factory=list)

    @property
    def defined(self) -> bool:
        """Some layer defines the lease: a field came from a layer, not the built-in default."""
        return not all(f.layer in ("default", "unset") for f in self.fields)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tenantId": self.tenant_id, "projectId": self.project_id,
                "resource": self.resource, "noop": self.noop,
                "fields": [asdict(f) for f in self.fields]}


def definition_view(name: str, tenant_id: str, project_id: str) -> DefinitionView:
    """The merged definition of lease ``name`` as an acquisition in (tenant, project) sees it.

    Reads every layer afresh: the cache entry is discarded first, so an operator process
    that is not on the change-event chain never shows a stale merge.

    Raises:
        InvalidLeaseRequest: malformed name or ids.
        LeaseUnavailable: a layer is unreadable or broken (what an acquisition would get).
    """
    validation.lease_name(name)
    validation.entity_id(tenant_id, "tenant id")
    validation.entity_id(project_id, "project id")
    definitions.cache.invalidate(tenant_id, project_id, name)
    merged = definitions.load(name, tenant_id, project_id)
    sources = merged.sources
    fields = [DefinitionField("resource", merged.resource, sources.get("resource", "default"))]
    for level in definitions.LEVELS:
        key = f"levels.{level}"
        fields.append(DefinitionField(key, merged.levels.get(level), sources.get(key, "unset")))
    fields.append(DefinitionField("ttlSeconds", merged.ttl_seconds, sources.get("ttlSeconds", "default")))
    fields.append(DefinitionField("waitMs", merged.wait_ms, sources.get("waitMs", "default")))
    return DefinitionView(merged.name, tenant_id, project_id, merged.resource, merged.is_noop, fields)
