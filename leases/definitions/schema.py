"""The YAML schema of a lease definition layer: which fields exist, which layer may set each, their bounds.

:func:`parse_layer` turns one layer's text into its owned, validated fields (fail closed:
an unknown or misspelt key breaks the layer, it could be the cap that protects the
resource); :func:`ignored_fields` names the fields a layer may not own. Merging the layers
is :mod:`leases.definitions.model`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import yaml

from ..errors import InvalidDefinition, InvalidLeaseRequest
from ..ids.validation import ID_RE, PRIORITY_RE, RESOURCE_RE, priority_class

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
    # The level whose counter the resource's guard checks (leases.queue.fences): the operator's,
    # like the resource ceiling, so every tenant's holders are fenced on the same counter.
    "fence": ("classpath", "system"),
}
TOP_FIELDS = ("name", "resource", "levels", "ttlSeconds", "waitMs", "shares", "priorities", "defaultPriority",
              "allowedPriorities", "maxStarvationMs", "fence")
MAX_PRIORITIES = 8
MAX_WEIGHT = 1_000_000
MAX_STARVATION_MS = 24 * 3600 * 1000
INLINE_FIELDS = ("levels.project", "levels.user", "ttlSeconds", "waitMs")
DEFAULT_TTL_SECONDS = 60
DEFAULT_WAIT_MS = 0
MAX_TTL_SECONDS = 7 * 24 * 3600
MAX_WAIT_MS = 10 * 60 * 1000



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
    """:func:`leases.ids.validation.priority_class` inside a layer, where a refused name breaks
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
                "maxStarvationMs", "fence"):
        if doc.get(key) is not None:
            flat[key] = doc[key]
    return flat


def _owned_fields(doc: Any, name: str, layer: str) -> dict[str, Any]:
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
        elif key == "fence":
            if value not in LEVELS:
                raise _BrokenLayer(f"fence must name a level ({', '.join(LEVELS)}), got {value!r}")
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
        return _owned_fields(yaml.safe_load(text), name, layer)
    except yaml.YAMLError as exc:
        raise InvalidDefinition(f"lease {name} layer {layer}: YAML does not parse: {exc}") from None
    except _BrokenLayer as exc:
        raise InvalidDefinition(f"lease {name} layer {layer}: {exc}") from None


def inline_fields(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """Validate an inline definition's fields (``name`` left out) as a project layer's.

    Raises:
        InvalidDefinition: wrong types or bounds.
    """
    try:
        return _owned_fields(spec, name, "project")
    except _BrokenLayer as exc:
        raise InvalidDefinition(f"inline lease {name}: {exc}") from None
