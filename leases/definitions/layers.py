"""Config documents (the stored lease layers) and their change events.

Writes go through :func:`put_document` / :func:`delete_document` (and the admin, whose
saves call the same change event), so every process drops the affected cache entries.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pymongo.errors

from ..errors import InvalidDefinition, LeaseUnavailable
from ..ids.validation import entity_id
from ..store import client as store
from . import caps, invalidation, model as definitions
from .model import LAYERS, SYSTEM_TENANT, TENANT_PROJECT, parse_layer

log = logging.getLogger(__name__)

LEASE_PATH_RE = re.compile(r"_vance/config/lease/([A-Za-z0-9][A-Za-z0-9_-]{0,63})\.yaml", re.ASCII)
MAX_DOCUMENT_BYTES = 64 * 1024


def layer_of(tenant_id: str, project_id: str) -> str:
    """Which layer a stored document at (tenant, project) forms."""
    if tenant_id == SYSTEM_TENANT and project_id == TENANT_PROJECT:
        return "system"
    if project_id == TENANT_PROJECT:
        return "tenant"
    return "project"


def lease_name_of(path: str) -> str:
    """The lease name of a config path.

    Raises:
        InvalidDefinition: the path is not ``_vance/config/lease/<name>.yaml``.
    """
    match = LEASE_PATH_RE.fullmatch(path) if isinstance(path, str) else None
    if match is None:
        raise InvalidDefinition(f"config path {path!r} is not _vance/config/lease/<name>.yaml")
    return match.group(1)


def validate_document(tenant_id: str, project_id: str, path: str, text: str) -> str:
    """Check ids, path and YAML of a document before it is stored; returns the lease name.

    Raises:
        InvalidLeaseRequest: bad tenant or project id.
        InvalidDefinition: bad path, oversize, or YAML that would fail the load.
    """
    entity_id(tenant_id, "tenant id")
    entity_id(project_id, "project id")
    name = lease_name_of(path)
    if not isinstance(text, str) or len(text.encode("utf-8")) > MAX_DOCUMENT_BYTES:
        raise InvalidDefinition(f"document text must be a string of at most {MAX_DOCUMENT_BYTES} bytes")
    parse_layer(text, name, layer_of(tenant_id, project_id))
    return name


def ignored_fields(tenant_id: str, project_id: str, path: str, text: str) -> list[str]:
    """The fields of a document that its layer may not own: stored, but never applied (a
    tenant admin must not be left believing they raised their own share).

    Raises:
        InvalidDefinition: the path is not a lease document path.
    """
    return definitions.ignored_fields(text, lease_name_of(path), layer_of(tenant_id, project_id))


def ignored_note(tenant_id: str, project_id: str, path: str, text: str) -> str:
    """A sentence naming the ignored fields and their owners; "" when none."""
    ignored = ignored_fields(tenant_id, project_id, path, text)
    if not ignored:
        return ""
    layer = layer_of(tenant_id, project_id)
    owners = "; ".join(f"{key}: {', '.join(definitions.FIELD_OWNERS[key])}" for key in ignored)
    return (f"ignored, not applied: {', '.join(ignored)} — the {layer} layer may not own "
            f"{'this field' if len(ignored) == 1 else 'these fields'} (owners: {owners})")


def changed(tenant_id: str, project_id: str, path: str) -> None:
    """The document change event, after every write of a stored layer (this module's, the
    admin's): stamp the caps now in force onto the counters the layer governs, so a lowered
    cap binds every process at once (:mod:`leases.definitions.caps`), then drop cached definitions here
    and in every other process.

    Like the change event, a stamp that fails is logged, not raised: the document is stored,
    and the processes' caches still retire within the liveness bound.
    """
    match = LEASE_PATH_RE.fullmatch(path or "")
    name = match.group(1) if match else None
    if name is not None:
        try:
            caps.stamp(tenant_id, project_id, name)
        except (LeaseUnavailable, pymongo.errors.PyMongoError) as exc:
            log.error("could not stamp the caps of lease %s after a change at %s/%s: %s", name, tenant_id,
                      project_id, exc)
    invalidation.publish(tenant_id, project_id, name)


def put_document(tenant_id: str, project_id: str, path: str, text: str) -> list[str]:
    """Create or replace the config document at (tenant, project, path).

    Returns:
        The fields the document's layer may not own (stored, never applied; see
        :func:`ignored_fields`), so the caller can say so.

    Raises:
        InvalidLeaseRequest: bad tenant or project id.
        InvalidDefinition: bad path or a document that would not load; nothing is written.
        LeaseUnavailable: the store is unreachable.
    """
    validate_document(tenant_id, project_id, path, text)
    try:
        store.config_documents().update_one(
            {"tenantId": tenant_id, "projectId": project_id, "path": path},
            {"$set": {"text": text}, "$currentDate": {"updatedAt": True}},
            upsert=True,
        )
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("config store", exc)) from None
    changed(tenant_id, project_id, path)
    return ignored_fields(tenant_id, project_id, path, text)


def delete_document(tenant_id: str, project_id: str, path: str) -> bool:
    """Delete the config document at (tenant, project, path); True if one existed.

    Raises:
        InvalidLeaseRequest: bad tenant or project id.
        InvalidDefinition: bad path.
        LeaseUnavailable: the store is unreachable.
    """
    entity_id(tenant_id, "tenant id")
    entity_id(project_id, "project id")
    lease_name_of(path)
    try:
        result = store.config_documents().delete_one({"tenantId": tenant_id, "projectId": project_id, "path": path})
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("config store", exc)) from None
    changed(tenant_id, project_id, path)
    return result.deleted_count == 1


def list_documents(tenant_id: str | None = None) -> list[dict[str, Any]]:
    """Stored config documents, optionally of one tenant."""
    query = {} if tenant_id is None else {"tenantId": entity_id(tenant_id, "tenant id")}
    return list(store.config_documents().find(query, {"_id": 0}).sort([("tenantId", 1), ("projectId", 1), ("path", 1)]))


__all__ = ["put_document", "ignored_fields", "ignored_note", "delete_document", "list_documents", "changed", "validate_document", "LAYERS"]
