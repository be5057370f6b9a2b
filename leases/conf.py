"""Every ``LEASES_*`` setting the app reads, with its default, read one way.

A host project sets only what it wants to change; everything else has a default here, so a
missing setting never surfaces as an ``AttributeError`` deep inside a request. Values are read
from ``django.conf.settings`` on every access (``override_settings`` in tests works, and a
setting is never frozen at import time)::

    from leases.conf import lease_settings

    lease_settings.TICKET_TTL_MS    # LEASES_TICKET_TTL_MS or 3000

``MONGODB_URI`` is read here too: the engine talks to MongoDB with pymongo on that URI, beside
whatever database Django's ``default`` alias uses (the lease apps' own models live on the
alias ``LEASES_DATABASE`` names, see :mod:`leases.routers`).
"""

from __future__ import annotations

from typing import Any

# name (without the LEASES_ prefix) -> default. The docs' settings reference (docs/reference/settings.md)
# is written from this table and the comments beside each entry at every docs build.
DEFAULTS: dict[str, Any] = {
    # Store
    "MONGO_TIMEOUT_MS": 2000,
    # How many acquire steps (an attempt, a turn; releases, claims and renewals go at once)
    # one process — and one event loop — runs at once; the others wait their turn, up to
    # LEASES_STORE_ADMISSION_MS, so a burst of requests queues in the clients instead of
    # piling onto the store until every command times out. 0: no limit.
    "STORE_CONCURRENCY": 2,
    # The longest an acquire step waits for its turn among its process's steps; past it the
    # step fails as a store timeout would (LeaseUnavailable).
    "STORE_ADMISSION_MS": 30000,
    # The Django database alias (a django-mongodb-backend one) of the lease apps' models;
    # leases.routers.LeasesRouter sends them there.
    "DATABASE": "default",
    # Sweeps and reconcile
    "REAP_INTERVAL": 30,
    "RECONCILE_SAFETY_MS": 60000,
    # Pod-to-pod calls
    "INTERNAL_SECRET": "insecure-dev-internal-secret-change-me",
    "REDIS_URL": "redis://127.0.0.1:6379/1",
    "POD_ENDPOINT": None,
    "POD_INTERVAL_SECONDS": 10,
    "POD_INTERVAL_MIN": 2,
    "POD_INTERVAL_MAX": 60,
    "POD_EXPIRY_FACTOR": 3,
    "POD_AUTOSTART": True,
    "WORKER_INTERNAL_BIND": "127.0.0.1:0",
    # Definitions cache
    "DEFINITION_CACHE_SECONDS": 300,
    "INVALIDATION_LIVENESS_MS": 2000,
    # A lease name no layer defines: "noop" (the spec's default: acquire NOOP, unlimited) or
    # "error" (raise UnknownLease, code UNKNOWN_LEASE). Either way the name is recorded.
    "UNDEFINED_LEASE": "noop",
    # Waiting
    "HTTP_MAX_WAIT_MS": 5000,
    # Ticket polls that wait for their grant (GET /api/v1/tickets/{id}?waitMs=) at once, per
    # process: each holds a web worker thread, so keep it below the server's threads per
    # process (a poll beyond it answers at once, as without waitMs).
    "HTTP_LONG_POLLS": 4,
    "TICKET_TTL_MS": 3000,
    "WAIT_POLL_MS": 1000,
    # The most tickets one resource's queue (its gate) holds: a request that finds it full
    # is answered Busy at once (HTTP 429, ``queueFull``) instead of queueing, so the gate
    # document — the resource's hottest — stays bounded however many ask.
    "QUEUE_LIMIT": 2000,
    # The most of those the gate document itself holds (its head, where the order rule
    # decides); the rest wait in their own documents (leases.queue.backlog).
    "QUEUE_HEAD": 32,
    "REPAIR_INTERVAL_MS": 500,
    # A slot handed to a waiting ticket by the release that freed it must be claimed (its
    # holder marked HELD) within this long, or it goes to the next ticket.
    "GRANT_CLAIM_MS": 500,
    # A blocking acquire answered by a hand-off marks its holder HELD this long after its
    # answer (at most half the claim window), or never if it is released first: short holds
    # skip one command. Until the mark, the holder is PENDING, and a process that dies while
    # using the slot is ended without its handler; 0 marks at once.
    "GRANT_MARK_DELAY_MS": 50,
    "TICKET_POLL_SECONDS": 2,
    # The least LeaseBusy.retry_after the engine suggests (ms): a caller that sleeps it
    # must not spin, however short the recorded holds.
    "RETRY_AFTER_MIN_MS": 100,
    # History
    "HISTORY_HOURS": 24,
    "HISTORY_FLUSH_SECONDS": 5,
    # Tenancy: who may see which tenant in which role (a leases.tenancy.TenantAccess)
    "TENANT_ACCESS": "insights.access.ModelTenantAccess",
    # Reference consumers
    "SESSION_TOOLS": {},
    # Metrics: every series is <namespace>_lease_<name>; read once at import (leases.telemetry.metrics)
    "METRICS_NAMESPACE": "vance",
    # The name the Insights pages carry ("<brand> Insights", "<page> · <brand>"): the seed's
    # platform name unless the host sets its own.
    "BRAND": "Vance",
    # Crash-window tests only (leases.engine.pausepoints): off, so LEASES_TEST_PAUSE alone is inert.
    "TEST_PAUSE_POINTS": False,
}

# The value a production deployment must not keep (checked by leases.checks).
INSECURE_INTERNAL_SECRET = DEFAULTS["INTERNAL_SECRET"]


class LeaseSettings:
    """Attribute access to ``LEASES_<NAME>`` with the defaults above."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"no lease setting {name!r} (known: {', '.join(sorted(DEFAULTS))})")
        from django.conf import settings

        value = getattr(settings, f"LEASES_{name}", None)
        return DEFAULTS[name] if value is None else value

    @property
    def MONGODB_URI(self) -> str:  # noqa: N802 - mirrors the setting's name
        """The engine's MongoDB connection string (``settings.MONGODB_URI``; empty if unset)."""
        from django.conf import settings

        return (getattr(settings, "MONGODB_URI", "") or "").strip()


lease_settings = LeaseSettings()
