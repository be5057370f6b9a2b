"""The tenancy hook: who may see which tenant in which role, asked by Insights and API keys.

The engine only knows tenant ids (plain strings on every holder and counter). Which users
belong to which tenant is the host's business, so the pages that show a tenant's leases
(Insights) and manage its API keys ask one object, named by the dotted-path setting
``LEASES_TENANT_ACCESS`` (default: :class:`insights.access.ModelTenantAccess`, on the
``insights`` app's Tenant/Project/Membership models). A host with a tenant model of its own
subclasses :class:`TenantAccess` and points the setting at it.

Whatever the hook answers, the tenant binding stays in the MongoDB filters: the pages pass
the granted tenant's id to every engine query, never a user-supplied one unchecked.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

ADMIN = "ADMIN"
MEMBER = "MEMBER"
ROLES = (ADMIN, MEMBER)


@dataclass(frozen=True)
class TenantGrant:
    """One tenant a user may see, and the role the user has in it.

    ``slug`` is the tenant's id in every lease document (``tenantId``); ``name`` is what the
    pages show.
    """

    slug: str
    name: str
    role: str

    @property
    def is_admin(self) -> bool:
        """Only admins see Insights → Leases and manage API keys."""
        return self.role == ADMIN

    def get_role_display(self) -> str:
        return self.role.capitalize()


class TenantAccess:
    """The hook's interface; subclass it for your own tenant model.

    Every ``tenant_id`` / ``project_id`` passed in has already been checked against the
    engine's id rules (``leases.ids.validation.ID_RE``), so it is a plain string, safe to use as a
    lookup value.
    """

    def grant(self, user: Any, tenant_id: str) -> TenantGrant | None:
        """The role of ``user`` in ``tenant_id``; ``None`` when the user may not see it at all.

        ``None`` for a missing tenant too: a stranger cannot tell one from the other.
        """
        raise NotImplementedError

    def grants(self, user: Any) -> list[TenantGrant]:
        """Every tenant ``user`` may see (the Insights start page), in display order."""
        raise NotImplementedError

    def projects(self, tenant_id: str) -> list[str]:
        """The project ids of ``tenant_id`` (for forms and API keys bound to a project)."""
        raise NotImplementedError

    def tenant_exists(self, tenant_id: str) -> bool:
        """Whether ``tenant_id`` names a tenant (an API key for a made-up one is refused)."""
        raise NotImplementedError

    def project_exists(self, tenant_id: str, project_id: str) -> bool:
        """Whether ``tenant_id`` has project ``project_id``."""
        return project_id in self.projects(tenant_id)


_lock = threading.Lock()
_cached: tuple[str, TenantAccess] | None = None


def tenant_access() -> TenantAccess:
    """The configured hook (``LEASES_TENANT_ACCESS``), built once per dotted path.

    Raises:
        ImproperlyConfigured: the path does not import, or does not name a
            :class:`TenantAccess` subclass (fails closed: no page is shown).
    """
    global _cached
    from leases.conf import lease_settings

    path = lease_settings.TENANT_ACCESS
    cached = _cached
    if cached is not None and cached[0] == path:
        return cached[1]
    try:
        target = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"LEASES_TENANT_ACCESS {path!r} does not import: {exc}") from exc
    if not (isinstance(target, type) and issubclass(target, TenantAccess)):
        raise ImproperlyConfigured(f"LEASES_TENANT_ACCESS {path!r} is not a leases.tenancy.TenantAccess subclass")
    with _lock:
        _cached = (path, target())
        return _cached[1]
