"""Lease definitions: four YAML layers merged field by field, cached, fail-closed.

Layers, least to most specific: ``classpath`` (bundled defaults in ``leases/defaults``),
``system`` (tenant ``_vance``, project ``_tenant``), ``tenant`` (holder's tenant, project
``_tenant``), ``project`` (holder's tenant and project). A field set in a layer that may
not own it is ignored; a layer that cannot be read or parsed fails the load with
:class:`LeaseUnavailable`, and nothing is cached.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from importlib import resources
from typing import Any, NamedTuple

import pymongo.errors
import yaml

from .. import ids
from ..errors import InvalidDefinition, InvalidLeaseRequest, LeaseUnavailable, PriorityNotAllowed
from ..store import client as store, server_clock
from ..validation import ID_RE, LEASE_NAME_RE, PRIORITY_RE, RESOURCE_RE, entity_id, lease_name, priority_class

log = logging.getLogger(__name__)

SYSTEM_TENANT = "_vance"
TENANT_PROJECT = "_tenant"
LAYERS = ("classpath", "system", "tenant", "project")
LEVELS = ("global", "tenant", "project", "user")
# Check order of the funnel: narrow to wide.
CHECK_ORDER = ("user", "project", "tenant", "global")
FIELD_OWNERS: dict[str, tuple[str, ...]] = {
    "levels.global": ("classpath", "system"),
    "resource": ("classpath", "system", "tenant"),
    "levels.tenant": ("classpath", "system", "tenant"),
    "levels.project": LAYERS,
    "levels.user": LAYERS,
    "ttlSeconds": LAYERS,
    "waitMs": LAYERS,
    # Who goes next: the operator decides tenants' weights and the classes (and who may use
    # which), a tenant admin its projects' weights; a project cannot raise its own share.
    "shares.tenants": ("classpath", "system"),
    "shares.projects": ("classpath", "system", "tenant"),
    "priorities": ("classpath", "system"),
    "defaultPriority": ("classpath", "system"),
    "allowedPriorities": ("classpath", "system"),
    "maxStarvationMs": ("classpath", "system"),
}
TOP_FIELDS = ("name", "resource", "levels", "ttlSeconds", "waitMs", "shares", "priorities", "defaultPriority",
              "allowedPriorities", "maxStarvationMs")
MAX_PRIORITIES = 8
MAX_WEIGHT = 1_000_000
MAX_STARVATION_MS = 24 * 3600 * 1000
INLINE_FIELDS = ("levels.project", "levels.user", "ttlSeconds", "waitMs")
DEFAULT_TTL_SECONDS = 60
DEFAULT_WAIT_MS = 0
MAX_TTL_SECONDS = 7 * 24 * 3600
MAX_WAIT_MS = 10 * 60 * 1000


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
        }


class _BrokenLayer(Exception):
    pass


def _number(value: Any, what: str, minimum: int, maximum: int) -> int:
    # bool is an int in Python; ``cap: yes`` must not become 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BrokenLayer(f"{what} must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise _BrokenLayer(f"{what} must be between {minimum} and {maximum}, got {value}")
    return value


def _weights(value: Any, what: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise _BrokenLayer(f"{what} is not a mapping of id to weight")
    out: dict[str, float] = {}
    for key, weight in value.items():
        if not isinstance(key, str) or ID_RE.fullmatch(key) is None:
            raise _BrokenLayer(f"{what}: {key!r} is not a valid id")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or not 0 < weight <= MAX_WEIGHT:
            raise _BrokenLayer(f"{what}.{key} must be a positive number up to {MAX_WEIGHT}, got {weight!r}")
        out[key] = weight
    return out


def _class_name(value: Any, message: str) -> str:
    """:func:`leases.validation.priority_class` inside a layer, where a refused name breaks
    the layer (``message``) instead of answering a request.

    Raises:
        _BrokenLayer: ``value`` is no class name.
    """
    try:
        return priority_class(value)
    except InvalidLeaseRequest:
        raise _BrokenLayer(message) from None


def _classes(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not value or len(value) > MAX_PRIORITIES:
        raise _BrokenLayer(f"{what} must be a list of 1 to {MAX_PRIORITIES} class names")
    for name in value:
        _class_name(name, f"{what}: {name!r} is not a class name (must match {PRIORITY_RE.pattern})")
    if len(set(value)) != len(value):
        raise _BrokenLayer(f"{what} names a class twice")
    return list(value)


def _all_fields(doc: Any, name: str) -> dict[str, Any]:
    """One layer's parsed YAML flattened to ``{"levels.user": 1, ...}`` (shape checks only)."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise _BrokenLayer("document is not a mapping")
    unknown = set(doc) - set(TOP_FIELDS)
    if unknown:
        # Fail closed: a misspelt key could be the cap that protects the resource.
        raise _BrokenLayer(f"unknown fields {sorted(map(str, unknown))}")
    if "name" in doc and doc["name"] != name:
        raise _BrokenLayer(f"name {doc['name']!r} does not match the file name {name!r}")
    flat: dict[str, Any] = {}
    levels = doc.get("levels")
    if levels is not None:
        if not isinstance(levels, dict):
            raise _BrokenLayer("levels is not a mapping")
        bad = set(levels) - set(LEVELS)
        if bad:
            raise _BrokenLayer(f"unknown levels {sorted(map(str, bad))}")
        for level, cap in levels.items():
            if cap is not None:
                flat[f"levels.{level}"] = cap
    shares = doc.get("shares")
    if shares is not None:
        if not isinstance(shares, dict) or set(shares) - {"tenants", "projects"}:
            raise _BrokenLayer("shares must be a mapping with tenants and/or projects")
        for part in ("tenants", "projects"):
            if shares.get(part) is not None:
                flat[f"shares.{part}"] = shares[part]
    for key in ("resource", "ttlSeconds", "waitMs", "priorities", "defaultPriority", "allowedPriorities",
                "maxStarvationMs"):
        if doc.get(key) is not None:
            flat[key] = doc[key]
    return flat


def _flatten(doc: Any, name: str, layer: str) -> dict[str, Any]:
    """Validate one layer's parsed YAML and flatten it to its owned fields."""
    flat = _all_fields(doc, name)
    owned = {}
    for key, value in flat.items():
        if layer not in FIELD_OWNERS[key]:
            log.info("lease %s: field %s in layer %s ignored (not owned by that layer)", name, key, layer)
            continue
        owned[key] = value
    for key, value in owned.items():
        if key.startswith("levels."):
            _number(value, key, 1, 10**9)
        elif key == "ttlSeconds":
            _number(value, key, 1, MAX_TTL_SECONDS)
        elif key == "waitMs":
            _number(value, key, 0, MAX_WAIT_MS)
        elif key == "maxStarvationMs":
            _number(value, key, 1, MAX_STARVATION_MS)
        elif key.startswith("shares."):
            owned[key] = _weights(value, key)
        elif key == "priorities":
            owned[key] = _classes(value, key)
        elif key == "defaultPriority":
            _class_name(value, f"defaultPriority {value!r} is not a class name")
        elif key == "allowedPriorities":
            if not isinstance(value, dict):
                raise _BrokenLayer("allowedPriorities is not a mapping of tenant id to classes")
            for tenant, classes in value.items():
                if not isinstance(tenant, str) or ID_RE.fullmatch(tenant) is None:
                    raise _BrokenLayer(f"allowedPriorities: {tenant!r} is not a valid tenant id")
                _classes(classes, f"allowedPriorities.{tenant}")
        elif key == "resource":
            if not isinstance(value, str) or RESOURCE_RE.fullmatch(value) is None or value.startswith("mcp-inline:"):
                raise _BrokenLayer(f"resource {value!r} is not a valid resource name")
    if "defaultPriority" in owned and "priorities" in owned and owned["defaultPriority"] not in owned["priorities"]:
        raise _BrokenLayer(f"defaultPriority {owned['defaultPriority']!r} is not one of {owned['priorities']}")
    if "allowedPriorities" in owned and "priorities" in owned:
        for tenant, classes in owned["allowedPriorities"].items():
            if set(classes) - set(owned["priorities"]):
                raise _BrokenLayer(f"allowedPriorities.{tenant} names classes not in {owned['priorities']}")
    return owned


def ignored_fields(text: str, name: str, layer: str) -> list[str]:
    """The fields of a layer document that its layer may not own (they are never applied);
    [] for a document that does not parse (:func:`parse_layer` says why)."""
    try:
        flat = _all_fields(yaml.safe_load(text), name)
    except (yaml.YAMLError, _BrokenLayer):
        return []
    return sorted(key for key in flat if layer not in FIELD_OWNERS[key])


def parse_layer(text: str, name: str, layer: str) -> dict[str, Any]:
    """Parse one YAML layer into its owned, validated fields.

    Raises:
        InvalidDefinition: broken YAML, wrong types, caps < 1, unknown fields.
    """
    try:
        return _flatten(yaml.safe_load(text), name, layer)
    except yaml.YAMLError as exc:
        raise InvalidDefinition(f"lease {name} layer {layer}: YAML does not parse: {exc}") from None
    except _BrokenLayer as exc:
        raise InvalidDefinition(f"lease {name} layer {layer}: {exc}") from None


def _bundled_text(name: str) -> str | None:
    path = resources.files("leases").joinpath("defaults", *document_path(name).split("/"))
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _read_layers(name: str, tenant_id: str, project_id: str) -> dict[str, str]:
    """Raw YAML text per layer; one MongoDB command for the three stored layers."""
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
                    raise _BrokenLayer(f"layer {layer} document has no text")
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
    except _BrokenLayer as exc:
        raise LeaseUnavailable(f"lease {name}: {exc}") from None
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
    try:
        fields = _flatten({k: v for k, v in spec.items() if k != "name"}, name, "project")
    except _BrokenLayer as exc:
        raise InvalidDefinition(f"inline lease {name}: {exc}") from None
    definition = merge(name, {"project": fields})
    return LeaseDefinition(
        name=name,
        resource=f"mcp-inline:{tenant_id}/{project_id}/{name}",
        levels=definition.levels,
        ttl_seconds=definition.ttl_seconds,
        wait_ms=definition.wait_ms,
        sources=dict.fromkeys(definition.sources, "inline"),
        inline=True,
        loaded_at=server_clock.at(time.monotonic()) if definition.levels else None,
    )


class _Entry(NamedTuple):
    definition: LeaseDefinition
    cached_at: float
    epoch: int


class DefinitionCache:
    """Merged definitions per (tenant, project, name), invalidated by config changes.

    The cache only serves while it has been told that changes from other processes reach
    this one. The invalidation subscription (attached by the app, :mod:`leases.definitions.invalidation`)
    tells it :meth:`live_until` — the current live epoch and until when (monotonic time) its
    latest proof holds — and :meth:`not_live` when the connection is lost; the cache never
    asks anyone. Without a live proof every read loads the layers. An entry is served only
    in the epoch it was loaded in. A load that raced with an invalidation is not stored
    (generation check), so a change published while a load was in flight can never leave a
    stale entry behind.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], _Entry] = {}
        self._generation = 0
        # (epoch, monotonic deadline of the latest proof, pid told), replaced as a whole so
        # a reader never sees one epoch with another epoch's deadline; None: not live. A
        # forked child inherits the parent's proof but not the thread that earned it.
        self._live: tuple[int, float, int] | None = None

    def live_until(self, epoch: int, deadline: float) -> None:
        """Told: every change published elsewhere reaches this process until ``deadline`` (monotonic)."""
        self._live = (epoch, deadline, os.getpid())

    def not_live(self) -> None:
        """Told: changes may not reach this process any more; serve nothing until told again."""
        self._live = None
        self.clear()

    def live_epoch(self) -> int | None:
        """The epoch the cache serves in now, or None while it has no live proof."""
        live = self._live
        if live is None or time.monotonic() >= live[1] or live[2] != os.getpid():
            return None
        return live[0]

    def get(self, name: str, tenant_id: str, project_id: str) -> LeaseDefinition:
        """Cached merged definition, loading on a miss or while invalidation is not live.

        Raises:
            LeaseUnavailable: the load failed; nothing is cached.
        """
        from leases.conf import lease_settings

        key = (tenant_id, project_id, name)
        max_age = float(lease_settings.DEFINITION_CACHE_SECONDS)
        epoch = self.live_epoch()
        entry = self._entries.get(key)
        started = time.monotonic()
        if entry is not None and epoch is not None and entry.epoch == epoch and started - entry.cached_at < max_age:
            return entry.definition
        generation = self._generation
        definition = load(name, tenant_id, project_id)
        # Store only if invalidation was live for the whole load: otherwise another
        # process's write could go unnoticed here.
        if epoch is not None and self.live_epoch() == epoch:
            with self._lock:
                if generation == self._generation:
                    self._entries[key] = _Entry(definition, started, epoch)
        return definition

    def invalidate(self, tenant_id: str | None, project_id: str | None, name: str | None) -> None:
        """Drop entries touched by a change of (tenant, project, name).

        A System-layer change drops the name for every tenant and project, a Tenant-layer
        change for every project of that tenant; ``None`` everywhere drops all.
        """
        with self._lock:
            self._generation += 1
            if name is None:
                self._entries.clear()
                return
            for key in list(self._entries):
                t, p, n = key
                if n != name:
                    continue
                if tenant_id == SYSTEM_TENANT and project_id == TENANT_PROJECT:
                    del self._entries[key]
                elif project_id == TENANT_PROJECT and t == tenant_id:
                    del self._entries[key]
                elif (t, p) == (tenant_id, project_id):
                    del self._entries[key]

    def clear(self) -> None:
        """Drop everything."""
        self.invalidate(None, None, None)


cache = DefinitionCache()


def resolve(name: str, tenant_id: str, project_id: str) -> LeaseDefinition:
    """The merged definition for an acquisition (cached).

    Raises:
        LeaseUnavailable: broken or unreadable configuration.
    """
    return cache.get(name, tenant_id, project_id)
