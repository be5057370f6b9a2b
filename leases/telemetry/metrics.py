"""Prometheus metrics of the engine; tags stay low-cardinality (no tenant, project or user
ids), so a tenant with many users cannot blow up the scrape or learn about other tenants.

Every series is named ``<namespace>_lease_<name>``; the namespace is ``LEASES_METRICS_NAMESPACE``
(default ``vance``, the names of the platform the engine comes from), read once when this
module is imported: the metric objects are module-level and a Prometheus series cannot be
renamed once registered, so a changed setting takes effect at the next process start.

A host that runs more than one process (gunicorn workers, Celery pool children, beat) sets
``PROMETHEUS_MULTIPROC_DIR`` in every process's environment: each process then writes its
samples to its own file there and a scrape of any web process adds up all of them
(prometheus_client's multiprocess mode, see :mod:`leases.telemetry.multiprocess`). That is why
the gauge below declares how its per-process values combine.
"""

from __future__ import annotations

import logging
import re

from prometheus_client import Counter, Gauge, Histogram

from ..conf import DEFAULTS
from ..errors import InvalidSetting

DEFAULT_NAMESPACE: str = DEFAULTS["METRICS_NAMESPACE"]
# Prometheus metric names are [a-zA-Z_:][a-zA-Z0-9_:]*; colons are reserved for recording rules.
_NAMESPACE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def configured_namespace() -> str:
    """``LEASES_METRICS_NAMESPACE`` (the default without Django settings), validated.

    Raises:
        InvalidSetting: the value is not a string that can start a Prometheus metric name.
    """
    from django.core.exceptions import ImproperlyConfigured

    from ..conf import lease_settings

    try:
        value = lease_settings.METRICS_NAMESPACE
    except ImproperlyConfigured:  # imported outside a Django process: no host setting to honour
        value = DEFAULT_NAMESPACE
    if not isinstance(value, str) or not _NAMESPACE_RE.fullmatch(value):
        raise InvalidSetting(f"LEASES_METRICS_NAMESPACE must be letters, digits and underscores, not starting "
                             f"with a digit (it prefixes every metric name), got {value!r}")
    return value


def _namespace_at_import() -> str:
    """The namespace the series are created with: a bad setting must not end the process's
    start-up in a traceback before ``manage.py check`` can name it (``leases.E014``), so it
    falls back to the default here, and says so in the log."""
    try:
        return configured_namespace()
    except InvalidSetting as exc:
        logging.getLogger(__name__).error("%s; the metrics use %r until it is fixed", exc, DEFAULT_NAMESPACE)
        return DEFAULT_NAMESPACE


NAMESPACE = _namespace_at_import()
# Every series of this module is named PREFIX + its name (what a dashboard queries).
PREFIX = f"{NAMESPACE}_lease_"

ACQUIRE = Counter("acquire", "Lease acquisitions by outcome.", ["resource", "outcome"],
                  namespace=NAMESPACE, subsystem="lease")
CHECK = Counter("check", "Lease check-at-use calls by outcome.", ["resource", "outcome"],
                namespace=NAMESPACE, subsystem="lease")
RELEASE = Counter("release", "Lease releases by outcome.", ["resource", "outcome"],
                  namespace=NAMESPACE, subsystem="lease")
REAP = Counter("reap", "Holders reaped, by reason.", ["reason"], namespace=NAMESPACE, subsystem="lease")
RECONCILE = Counter("reconcile", "Counters corrected by reconcile.", ["outcome"],
                    namespace=NAMESPACE, subsystem="lease")

# In multiprocess mode each process writes its own value: "livesum" adds up the processes
# still running (a dead process's waiters are gone), instead of one series per pid.
WAITING = Gauge("waiting", "Requests waiting in a resource's queue (in the processes of this scrape).", ["resource"],
                namespace=NAMESPACE, subsystem="lease", multiprocess_mode="livesum")
WAIT_SECONDS = Histogram("wait_seconds", "Time from a queued acquire to its end.", ["resource"],
                         namespace=NAMESPACE, subsystem="lease",
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
# Priority labels come only from the classes a definition names (System layer, validated
# names, at most 8 per lease) or "none": never from a request's free text.
WAIT_BY_CLASS = Histogram("wait_by_class_seconds", "Time from a queued acquire to its end, by priority class.",
                          ["resource", "priority"], namespace=NAMESPACE, subsystem="lease",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
WAIT_OUTCOME = Counter("wait", "Queued acquisitions by outcome.", ["resource", "outcome"],
                       namespace=NAMESPACE, subsystem="lease")
# Counted by the resource's own guard (leases.fencing), labelled with the resource its owner
# named when building it: never from the fence string a caller sent.
FENCE_REJECTED = Counter("fence_rejected", "Uses a fence guard refused: the fence was older than one it had admitted.",
                         ["resource"], namespace=NAMESPACE, subsystem="lease")

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
