"""Lease names for pickers: every name some layer defines.

Reads only: the bundled defaults and the stored config documents' paths.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from ...definitions import model as definitions
from ...definitions.layers import LEASE_PATH_RE
from ...ids import validation
from ...store import client as store


def known_lease_names(tenant_id: str | None = None) -> list[str]:
    """Lease names with a definition somewhere: bundled defaults, the System layer and the
    tenant's own documents (all tenants' when ``tenant_id`` is None), for pickers.

    Raises:
        InvalidLeaseRequest: malformed tenant id.
    """
    names: set[str] = set()
    bundled = resources.files("leases").joinpath("defaults", "_vance", "config", "lease")
    if bundled.is_dir():
        names.update(entry.name[:-5] for entry in bundled.iterdir() if entry.name.endswith(".yaml"))
    query: dict[str, Any] = {}
    if tenant_id is not None:
        query = {"tenantId": {"$in": [definitions.SYSTEM_TENANT, validation.entity_id(tenant_id, "tenant id")]}}
    for path in store.config_documents().distinct("path", query):
        match = LEASE_PATH_RE.fullmatch(path or "")
        if match:
            names.add(match.group(1))
    return sorted(names)
