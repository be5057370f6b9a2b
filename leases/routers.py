"""A database router that keeps the lease apps' models on their MongoDB alias.

A host whose ``default`` database is PostgreSQL (or any other Django backend) adds a
django-mongodb-backend alias for the lease apps and this router::

    DATABASES = {
        "default": {"ENGINE": "django.db.backends.postgresql", ...},
        "leases": {"ENGINE": "django_mongodb_backend", "HOST": MONGODB_URI, "NAME": "leases"},
    }
    DATABASE_ROUTERS = ["leases.routers.LeasesRouter"]
    LEASES_DATABASE = "leases"

The lease apps' models (config documents, holders, counters, audit, API keys, the Insights
tenants) then live on that alias, and nothing else does; the engine itself talks to the same
server with pymongo on ``MONGODB_URI``. When ``LEASES_DATABASE`` is ``"default"`` (an
all-MongoDB project) the router changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from leases.conf import lease_settings

# Labels of the apps whose models belong on the lease alias.
LEASE_APP_LABELS = frozenset({"leases", "leases_api", "insights", "leases_jobs", "leases_sessions"})


def _is_ours(model: Any) -> bool:
    return model is not None and model._meta.app_label in LEASE_APP_LABELS


class LeasesRouter:
    """Route the lease apps to ``LEASES_DATABASE``; answer nothing for other apps' models.

    One exception: a host model reached *from* one of ours (``membership.user``, the user a
    membership points to) is read from and written to the host's ``default`` alias, not the
    lease alias the instance came from. List a router of your own for the user model before
    this one if users live elsewhere.
    """

    def _alias(self) -> str:
        return lease_settings.DATABASE

    def _route(self, model: Any, hints: dict[str, Any]) -> str | None:
        if _is_ours(model):
            return self._alias()
        instance = hints.get("instance")
        if instance is not None and _is_ours(type(instance)) and self._alias() != DEFAULT_DB_ALIAS:
            # Without this Django would look the host's model up on the instance's database.
            return DEFAULT_DB_ALIAS
        return None

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._route(model, hints)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._route(model, hints)

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        # Our models point to each other and to the host's user by id; MongoDB enforces no
        # foreign keys, so a relation across the two aliases is a stored value, nothing more.
        if _is_ours(type(obj1)) or _is_ours(type(obj2)):
            return True
        return None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        alias = self._alias()
        if app_label in LEASE_APP_LABELS:
            return db == alias
        if db == alias and alias != DEFAULT_DB_ALIAS:
            # The lease alias holds the lease apps' collections only.
            return False
        return None
