"""Prometheus metrics of §8; tags stay low-cardinality (no tenant, project or user ids)."""

from __future__ import annotations

from prometheus_client import Counter

ACQUIRE = Counter("vance_lease_acquire", "Lease acquisitions by outcome.", ["resource", "outcome"])
CHECK = Counter("vance_lease_check", "Lease check-at-use calls by outcome.", ["resource", "outcome"])
RELEASE = Counter("vance_lease_release", "Lease releases by outcome.", ["resource", "outcome"])
REAP = Counter("vance_lease_reap", "Holders reaped, by reason.", ["reason"])
RECONCILE = Counter("vance_lease_reconcile", "Counters corrected by reconcile.", ["outcome"])

INLINE_RESOURCE_TAG = "mcp-inline"


def resource_tag(resource: str) -> str:
    """The resource label: inline resources embed tenant/project ids, so they share one tag."""
    return INLINE_RESOURCE_TAG if resource.startswith("mcp-inline:") else resource
