"""Who may see a tenant's Insights pages: resolved from the URL for ``request.user``.

* anonymous → redirect to the login page;
* malformed slug, missing tenant, or not a member → 404 (a stranger cannot tell an
  existing tenant from a missing one);
* member without the ADMIN role → 403.
"""

from __future__ import annotations

from functools import wraps
from typing import Callable

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.views.defaults import permission_denied

from leases.validation import ID_RE

from .models import Membership, Tenant


def resolve_admin_tenant(request: HttpRequest, tenant_slug: str) -> Tenant:
    """The tenant named by ``tenant_slug`` if ``request.user`` is one of its admins.

    The caller handles anonymous users first (see :func:`tenant_admin_required`).

    Raises:
        Http404: malformed slug, no such tenant, or the user is not a member.
        PermissionDenied: the user is a member but not an ADMIN.
    """
    # The slug is checked before it reaches a query, so "$ne"-like values are just 404s.
    if not isinstance(tenant_slug, str) or ID_RE.fullmatch(tenant_slug) is None:
        raise Http404("No such tenant")
    # Two plain lookups instead of a join: "missing tenant" and "not a member" end alike.
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    membership = None if tenant is None else Membership.objects.filter(user_id=request.user.pk, tenant_id=tenant.pk).first()
    if membership is None:
        raise Http404("No such tenant")
    if not membership.is_admin:
        raise PermissionDenied("Insights → Leases is for tenant admins")
    return tenant


def tenant_admin_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Decorate a view taking ``tenant`` from the URL; it receives the :class:`Tenant` instead."""

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


def memberships_of(user) -> list[Membership]:
    """The user's memberships, for the start page."""
    if not user.is_authenticated:
        return []
    memberships = list(Membership.objects.filter(user_id=user.pk))
    tenants = Tenant.objects.in_bulk([m.tenant_id for m in memberships])
    for m in memberships:
        m.tenant = tenants[m.tenant_id]  # fill the relation without a join
    return sorted(memberships, key=lambda m: m.tenant.slug)
