"""Prometheus metrics of the engine; tags stay low-cardinality (no tenant, project or user
ids), so a tenant with many users cannot blow up the scrape or learn about other tenants."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ACQUIRE = Counter("vance_lease_acquire", "Lease acquisitions by outcome.", ["resource", "outcome"])
CHECK = Counter("vance_lease_check", "Lease check-at-use calls by outcome.", ["resource", "outcome"])
RELEASE = Counter("vance_lease_release", "Lease releases by outcome.", ["resource", "outcome"])
REAP = Counter("vance_lease_reap", "Holders reaped, by reason.", ["reason"])
RECONCILE = Counter("vance_lease_reconcile", "Counters corrected by reconcile.", ["outcome"])

WAITING = Gauge("vance_lease_waiting", "Requests waiting in a resource's queue (this process).", ["resource"])
WAIT_SECONDS = Histogram("vance_lease_wait_seconds", "Time from a queued acquire to its end.", ["resource"],
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
# Priority labels come only from the classes a definition names (System layer, validated
# names, at most 8 per lease) or "none": never from a request's free text.
WAIT_BY_CLASS = Histogram("vance_lease_wait_by_class_seconds", "Time from a queued acquire to its end, by priority class.",
                          ["resource", "priority"],
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
WAIT_OUTCOME = Counter("vance_lease_wait", "Queued acquisitions by outcome.", ["resource", "outcome"])

INLINE_RESOURCE_TAG = "mcp-inline"
# Names defined in no layer answer NOOP; their made-up names must not become label series.
UNDEFINED_TAG = "undefined"


def resource_tag(resource: str) -> str:
    """The resource label: inline resources embed tenant/project ids, so they share one tag."""
    return INLINE_RESOURCE_TAG if resource.startswith("mcp-inline:") else resource


def definition_tag(definition: object | None) -> str:
    """The label of a NOOP acquisition: the resource of a defined lease, else one fixed tag."""
    if definition is None:
        return "none"
    sources = getattr(definition, "sources", None) or {}
    if not getattr(definition, "inline", False) and all(layer == "default" for layer in sources.values()):
        return UNDEFINED_TAG
    return resource_tag(getattr(definition, "resource", UNDEFINED_TAG))
