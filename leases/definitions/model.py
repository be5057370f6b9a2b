"""Lease definitions: four YAML layers merged field by field, cached, fail-closed.

Layers, least to most specific: ``classpath`` (bundled defaults in ``leases/defaults``),
``system`` (tenant ``_vance``, project ``_tenant``), ``tenant`` (holder's tenant, project
``_tenant``), ``project`` (holder's tenant and project). A field set in a layer that may
not own it is ignored; a layer that cannot be read or parsed fails the load with
:class:`LeaseUnavailable`, and nothing is cached.

This module holds the definition (:class:`LeaseDefinition`), the merge and the load, and
the process's cache of merged definitions (:data:`cache`, :func:`resolve`). The layer
schema and its constants are :mod:`leases.definitions.schema` (re-exported here), the
cache's rules :mod:`leases.definitions.cache`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from importlib import resources
from typing import Any

import pymongo.errors

from .. import ids
from ..errors import InvalidDefinition, InvalidLeaseRequest, LeaseUnavailable, PriorityNotAllowed
from ..ids.validation import LEASE_NAME_RE, entity_id, lease_name
from ..store import client as store, server_clock
from .cache import DefinitionCache
from .schema import (
    CHECK_ORDER,
    DEFAULT_TTL_SECONDS,
    DEFAULT_WAIT_MS,
    FIELD_OWNERS,
    INLINE_FIELDS,
    LAYERS,
    LEVELS,
    MAX_PRIORITIES,
    MAX_STARVATION_MS,
    MAX_TTL_SECONDS,
    MAX_WAIT_MS,
    MAX_WEIGHT,
    SYSTEM_TENANT,
    TENANT_PROJECT,
    TOP_FIELDS,
    ignored_fields,
    inline_fields,
    parse_layer,
)

# The resource of an inline definition (:func:`inline_definition`) begins so: no stored
# definition names such a resource (the schema refuses it), and no layer write stamps its counters.
INLINE_RESOURCE_PREFIX = "mcp-inline:"

log = logging.getLogger(__name__)

__all__ = ["CHECK_ORDER", "DEFAULT_TTL_SECONDS", "DEFAULT_WAIT_MS", "DefinitionCache", "FIELD_OWNERS",
           "INLINE_FIELDS", "LAYERS", "LEVELS", "LeaseDefinition", "LevelSpec", "MAX_PRIORITIES",
           "MAX_STARVATION_MS", "MAX_TTL_SECONDS", "MAX_WAIT_MS", "MAX_WEIGHT", "SYSTEM_TENANT", "TENANT_PROJECT",
           "TOP_FIELDS", "cache", "document_path", "ignored_fields", "inline_definition", "load", "merge",
           "parse_layer", "resolve"]


def document_path(name: str) -> str:
    """The config path of lease ``name``: ``_vance/config/lease/<name>.yaml``."""
    return f"_vance/config/lease/{name}.yaml"


@dataclass(frozen=True)
class LevelSpec:
    """One booked level of an acquisition: its counter key and cap, and the view it comes
    from (``lease`` and ``loaded_at``: which cap stamps it obeys, :mod:`leases.definitions.caps`)."""

    level: str
    scope: str
    cap: int
    key: str
    tenant_id: str | None
    lease: str = field(default="", compare=False)
    loaded_at: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class LeaseDefinition:
    """A merged lease definition; ``sources`` tells which layer each field came from."""

    name: str
    resource: str
    levels: dict[str, int]
    ttl_seconds: int
    wait_ms: int
    sources: dict[str, str] = field(default_factory=dict)
    inline: bool = False
    tenant_shares: dict[str, float] = field(default_factory=dict)
    project_shares: dict[str, float] = field(default_factory=dict)
    priorities: tuple[str, ...] = ()
    default_priority: str | None = None
    allowed_priorities: dict[str, tuple[str, ...]] = field(default_factory=dict)
    max_starvation_ms: int | None = None
    # The capped level whose counter fences this lease's grants (None: the gate, the widest).
    fence_level: str | None = None
    # False when no layer (bundled, System, Tenant, Project) has a document for the name:
    # a misspelt name, acquired NOOP or refused per LEASES_UNDEFINED_LEASE.
    defined: bool = True
    # When its load began, on MongoDB's clock (None: unknown, the oldest view there is). A
    # counter's cap stamp binds the views loaded before it (leases.definitions.caps).
    loaded_at: datetime | None = field(default=None, compare=False)

    def tenant_weight(self, tenant_id: str) -> float:
        """The tenant's share weight at this resource (default 1)."""
        return float(self.tenant_shares.get(tenant_id, 1))

    def project_weight(self, project_id: str) -> float:
        """The project's weight within its tenant's share (default 1)."""
        return float(self.project_shares.get(project_id, 1))

    def classes_for(self, tenant_id: str) -> tuple[str, ...]:
        """The classes ``tenant_id`` may ask for (all, unless the System layer restricts it)."""
        allowed = self.allowed_priorities.get(tenant_id)
        return self.priorities if allowed is None else tuple(c for c in self.priorities if c in allowed)

    def priority_of(self, tenant_id: str, requested: str | None) -> tuple[int, str | None]:
        """``(rank, class)`` of a request (rank 0 is the highest class); the default class
        when ``requested`` is None. Never downgrades silently.

        Raises:
            InvalidLeaseRequest: a class the definition does not name.
            PriorityNotAllowed: a class the System layer does not let this tenant use
                (also the default class, when it is not among the tenant's).
        """
        if not self.priorities:
            if requested is not None:
                raise InvalidLeaseRequest(f"lease {self.name} defines no priority classes; got {requested!r}")
            return 0, None
        name = self.default_priority if requested is None else requested
        if name not in self.priorities:
            raise InvalidLeaseRequest(
                f"unknown priority {requested!r} for lease {self.name}; classes: {list(self.priorities)}")
        if name not in self.classes_for(tenant_id):
            raise PriorityNotAllowed(
                f"tenant {tenant_id} may not use priority {name!r} on lease {self.name}; "
                f"allowed: {list(self.classes_for(tenant_id))}")
        return self.priorities.index(name), name

    @property
    def is_noop(self) -> bool:
        """No caps at all: acquisitions return ``NOOP`` without touching MongoDB."""
        return not self.levels

    def level_specs(self, tenant_id: str, project_id: str, user_id: str) -> list[LevelSpec]:
        """The capped levels in check order (user → project → tenant → global)."""
        # Ids are encoded into the scope (leases.ids): a user "a/b" or "x|y" must not read as
        # another scope or key; every id valid before encodes to itself.
        scopes = {level: ids.scope(level, tenant_id, project_id, user_id) for level in CHECK_ORDER}
        return [
            LevelSpec(level, scopes[level], self.levels[level], ids.counter_key(self.resource, level, scopes[level]),
                      None if level == "global" else tenant_id, self.name, self.loaded_at)
            for level in CHECK_ORDER
            if level in self.levels
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain form for the CLI, the web view and the HTTP API."""
        return {
            "name": self.name, "resource": self.resource, "levels": dict(self.levels),
            "ttlSeconds": self.ttl_seconds, "waitMs": self.wait_ms,
            "sources": dict(self.sources), "inline": self.inline,
            "shares": {"tenants": dict(self.tenant_shares), "projects": dict(self.project_shares)},
            "priorities": list(self.priorities), "defaultPriority": self.default_priority,
            "allowedPriorities": {t: list(c) for t, c in self.allowed_priorities.items()},
            "maxStarvationMs": self.max_starvation_ms,
            "fence": self.fence_level or next((lv for lv in reversed(CHECK_ORDER) if lv in self.levels), None),
        }


def _bundled_text(name: str) -> str | None:
    path = resources.files("leases").joinpath("defaults", *document_path(name).split("/"))
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _read_layers(name: str, tenant_id: str, project_id: str) -> dict[str, str]:
    """Raw YAML text per layer; one MongoDB command for the three stored layers.

    Raises:
        LeaseUnavailable: a stored layer document has no text.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    texts: dict[str, str] = {}
    bundled = _bundled_text(name)
    if bundled is not None:
        texts["classpath"] = bundled
    wanted = [
        ((SYSTEM_TENANT, TENANT_PROJECT), "system"),
        ((tenant_id, TENANT_PROJECT), "tenant"),
        ((tenant_id, project_id), "project"),
    ]
    query = {
        "path": document_path(name),
        "$or": [{"tenantId": t, "projectId": p} for (t, p), _ in wanted],
    }
    for doc in store.config_documents().find(query, {"tenantId": 1, "projectId": 1, "text": 1}):
        # A merge seen from the tenant-wide project ``_tenant`` (or from ``_vance`` itself)
        # asks for the same (tenant, project) under several layers. One stored document is
        # one layer, the least specific it matches (what it was validated as on write), so
        # its fields are explained by the layer that really holds them and counted once.
        for key, layer in wanted:
            if key == (doc.get("tenantId"), doc.get("projectId")):
                if not isinstance(doc.get("text"), str):
                    raise LeaseUnavailable(f"lease {name}: layer {layer} document has no text")
                texts[layer] = doc["text"]
                break
    return texts


def merge(name: str, layer_fields: dict[str, dict[str, Any]]) -> LeaseDefinition:
    """Merge validated layers field by field: the most specific layer that owns a field wins."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for layer in LAYERS:
        for key, value in layer_fields.get(layer, {}).items():
            values[key] = value
            sources[key] = layer
    levels = {key.split(".", 1)[1]: values[key] for key in values if key.startswith("levels.")}
    if "resource" not in values:
        sources["resource"] = "default"
    for key in ("ttlSeconds", "waitMs"):
        sources.setdefault(key, "default")
    priorities = tuple(values.get("priorities") or ())
    default_priority = values.get("defaultPriority")
    allowed = {t: tuple(c) for t, c in (values.get("allowedPriorities") or {}).items()}
    if default_priority is not None and default_priority not in priorities:
        raise InvalidDefinition(f"lease {name}: defaultPriority {default_priority!r} is not one of {list(priorities)}")
    for tenant, classes in allowed.items():
        if set(classes) - set(priorities):
            raise InvalidDefinition(f"lease {name}: allowedPriorities.{tenant} names classes not in {list(priorities)}")
    fence = values.get("fence")
    if fence is not None and fence not in levels:
        # Fail closed: a guard keyed on a counter nobody books would admit everyone.
        raise InvalidDefinition(f"lease {name}: fence names level {fence!r}, which it does not cap "
                                f"(capped: {sorted(levels)})")
    if priorities and default_priority is None:
        # Not naming a class never buys the top one: the default is the lowest.
        default_priority = priorities[-1]
    return LeaseDefinition(
        name=name,
        resource=values.get("resource", name),
        levels=levels,
        ttl_seconds=values.get("ttlSeconds", DEFAULT_TTL_SECONDS),
        wait_ms=values.get("waitMs", DEFAULT_WAIT_MS),
        sources=sources,
        tenant_shares=dict(values.get("shares.tenants") or {}),
        project_shares=dict(values.get("shares.projects") or {}),
        priorities=priorities,
        default_priority=default_priority,
        allowed_priorities=allowed,
        max_starvation_ms=values.get("maxStarvationMs"),
        fence_level=fence,
    )


def load(name: str, tenant_id: str, project_id: str) -> LeaseDefinition:
    """Load and merge lease ``name`` as an acquisition in (tenant, project) sees it; no cache.

    Raises:
        InvalidLeaseRequest: invalid name or ids.
        LeaseUnavailable: a layer could not be read (store error) or parsed (broken config).
    """
    lease_name(name)
    entity_id(tenant_id, "tenant id")
    entity_id(project_id, "project id")
    began = time.monotonic()  # before the read: a stamp written during it binds this view
    try:
        texts = _read_layers(name, tenant_id, project_id)
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable(f"lease {name}: config store", exc)) from None
    layer_fields: dict[str, dict[str, Any]] = {}
    for layer, text in texts.items():
        try:
            layer_fields[layer] = parse_layer(text, name, layer)
        except InvalidDefinition as exc:
            raise LeaseUnavailable(str(exc)) from None
    if not texts:
        log.warning("lease %s is not defined in any layer; acquisitions are NOOP (or UnknownLease with "
                    "LEASES_UNDEFINED_LEASE = 'error')", name)
    try:
        definition = merge(name, layer_fields)
    except InvalidDefinition as exc:
        # Layers that only together contradict each other (a default class another layer
        # does not define): fail closed like a broken layer.
        raise LeaseUnavailable(str(exc)) from None
    if not texts:
        definition = replace(definition, defined=False)
    # A NOOP definition books nothing, so it needs no clock (and costs no command).
    return replace(definition, loaded_at=server_clock.at(began)) if definition.levels else definition


def inline_definition(spec: Any, tenant_id: str, project_id: str) -> LeaseDefinition:
    """Build an inline definition: no layers, no merge, project-private counter.

    Raises:
        InvalidDefinition: missing ``name``, a field inline may not set (``resource``,
            ``levels.global``, ``levels.tenant``), unknown fields or bad values.
    """
    if not isinstance(spec, dict):
        raise InvalidDefinition("inline lease definition must be a mapping")
    name = spec.get("name")
    if not isinstance(name, str) or LEASE_NAME_RE.fullmatch(name) is None:
        raise InvalidDefinition("inline lease definition needs a valid 'name'")
    if "resource" in spec:
        raise InvalidDefinition("inline lease definitions may not set 'resource': shared ceilings belong in a name reference")
    levels = spec.get("levels") or {}
    if not isinstance(levels, dict):
        raise InvalidDefinition("inline 'levels' must be a mapping")
    for forbidden in ("global", "tenant"):
        if forbidden in levels:
            raise InvalidDefinition(f"inline lease definitions may not set 'levels.{forbidden}': use a name reference")
    unknown = (set(spec) - {"name", "levels", "ttlSeconds", "waitMs"}) | (set(levels) - {"project", "user"})
    if unknown:
        raise InvalidDefinition(f"inline lease definition has unknown fields {sorted(map(str, unknown))}")
    fields = inline_fields({k: v for k, v in spec.items() if k != "name"}, name)
    definition = merge(name, {"project": fields})
    return LeaseDefinition(
        name=name,
        resource=f"{INLINE_RESOURCE_PREFIX}{tenant_id}/{project_id}/{name}",
        levels=definition.levels,
        ttl_seconds=definition.ttl_seconds,
        wait_ms=definition.wait_ms,
        sources=dict.fromkeys(definition.sources, "inline"),
        inline=True,
        loaded_at=server_clock.at(time.monotonic()) if definition.levels else None,
    )


cache: DefinitionCache[LeaseDefinition] = DefinitionCache(load)


def resolve(name: str, tenant_id: str, project_id: str) -> LeaseDefinition:
    """The merged definition for an acquisition (cached).

    Raises:
        LeaseUnavailable: broken or unreadable configuration.
    """
    return cache.get(name, tenant_id, project_id)
