"""Who may see a tenant's Insights pages: resolved from the URL for ``request.user``.

The answer comes from the tenancy hook (:func:`leases.tenancy.tenant_access`, setting
``LEASES_TENANT_ACCESS``); :class:`ModelTenantAccess` is the default, on this app's models.

* anonymous → redirect to the login page;
* malformed slug, missing tenant, or not a member → 404 (a stranger cannot tell an
  existing tenant from a missing one);
* member without the ADMIN role → 403, on every page but those every member may read
  (:func:`tenant_member_required`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.views.defaults import permission_denied

from leases.ids.validation import ID_RE
from leases.tenancy import TenantAccess, TenantGrant, tenant_access


class ModelTenantAccess(TenantAccess):
    """The default hook: ``insights.Tenant``, ``insights.Project`` and ``insights.Membership``."""

    def grant(self, user: Any, tenant_id: str) -> TenantGrant | None:
        from .models import Membership, Tenant

        if not getattr(user, "is_authenticated", False):
            return None
        # Two plain lookups instead of a join: "missing tenant" and "not a member" end alike.
        tenant = Tenant.objects.filter(slug=tenant_id).first()
        membership = None if tenant is None else Membership.objects.filter(user_id=user.pk, tenant_id=tenant.pk).first()
        if membership is None:
            return None
        return TenantGrant(slug=tenant.slug, name=tenant.name, role=membership.role)

    def grants(self, user: Any) -> list[TenantGrant]:
        from .models import Membership, Tenant

        if not getattr(user, "is_authenticated", False):
            return []
        memberships = list(Membership.objects.filter(user_id=user.pk))
        tenants = Tenant.objects.in_bulk([m.tenant_id for m in memberships])
        found = [TenantGrant(slug=tenants[m.tenant_id].slug, name=tenants[m.tenant_id].name, role=m.role)
                 for m in memberships if m.tenant_id in tenants]
        return sorted(found, key=lambda g: g.slug)

    def projects(self, tenant_id: str) -> list[str]:
        from .models import Project, Tenant

        tenant_pk = Tenant.objects.filter(slug=tenant_id).values_list("pk", flat=True).first()
        if tenant_pk is None:
            return []
        return list(Project.objects.filter(tenant_id=tenant_pk).order_by("slug").values_list("slug", flat=True))

    def tenant_exists(self, tenant_id: str) -> bool:
        from .models import Tenant

        return Tenant.objects.filter(slug=tenant_id).exists()

    def project_exists(self, tenant_id: str, project_id: str) -> bool:
        from .models import Project, Tenant

        tenant_pk = Tenant.objects.filter(slug=tenant_id).values_list("pk", flat=True).first()
        return tenant_pk is not None and Project.objects.filter(tenant_id=tenant_pk, slug=project_id).exists()


def resolve_member_tenant(request: HttpRequest, tenant_slug: str) -> TenantGrant:
    """The tenant named by ``tenant_slug`` if the hook says ``request.user`` is one of its
    members (any role).

    The caller handles anonymous users first (see :func:`tenant_member_required`).

    Raises:
        Http404: malformed slug, no such tenant, or the user is not a member.
        ImproperlyConfigured: ``LEASES_TENANT_ACCESS`` names no usable hook.
    """
    # The slug is checked before it reaches the hook, so "$ne"-like values are just 404s.
    if not isinstance(tenant_slug, str) or ID_RE.fullmatch(tenant_slug) is None:
        raise Http404("No such tenant")
    granted = tenant_access().grant(request.user, tenant_slug)
    if granted is None:
        raise Http404("No such tenant")
    if granted.slug != tenant_slug:
        # A hook answering for another tenant than asked would bind the pages to it.
        raise Http404("No such tenant")
    return granted


def resolve_admin_tenant(request: HttpRequest, tenant_slug: str) -> TenantGrant:
    """The tenant named by ``tenant_slug`` if the hook says ``request.user`` is one of its admins.

    The caller handles anonymous users first (see :func:`tenant_admin_required`).

    Raises:
        Http404: malformed slug, no such tenant, or the user is not a member.
        PermissionDenied: the user is a member but not an ADMIN.
        ImproperlyConfigured: ``LEASES_TENANT_ACCESS`` names no usable hook.
    """
    granted = resolve_member_tenant(request, tenant_slug)
    if not granted.is_admin:
        raise PermissionDenied("Insights → Leases is for tenant admins")
    return granted


def tenant_admin_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Decorate a view taking ``tenant`` from the URL; it receives the :class:`TenantGrant` instead."""

    @wraps(view)
    def wrapper(request: HttpRequest, tenant: str, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        try:
            admin_tenant = resolve_admin_tenant(request, tenant)
        except PermissionDenied as exc:
            # An expected answer, not a failure: rendered here, Django logs it as one
            # "Forbidden" line instead of a traceback of the raised exception.
            return permission_denied(request, exc)
        return view(request, admin_tenant, *args, **kwargs)

    return wrapper


def tenant_member_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Decorate a view taking ``tenant`` from the URL that every member of the tenant may
    see; it receives the :class:`TenantGrant` (whose role the view checks before a write)."""

    @wraps(view)
    def wrapper(request: HttpRequest, tenant: str, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        return view(request, resolve_member_tenant(request, tenant), *args, **kwargs)

    return wrapper


def grants_of(user: Any) -> list[TenantGrant]:
    """The tenants the user may see, for the start page."""
    if not user.is_authenticated:
        return []
    return tenant_access().grants(user)
