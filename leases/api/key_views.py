"""Insights → API keys: tenant admins create (plaintext shown once) and revoke keys.

Access is :func:`insights.access.tenant_admin_required` (the same rule as Insights →
Leases, asked of the tenancy hook ``LEASES_TENANT_ACCESS``: anonymous → login, non-member →
404, member without ADMIN → 403). These views use
the session and are CSRF-protected like every other page.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from insights.access import tenant_admin_required
from leases.errors import ApiKeyNotFound, InvalidLeaseRequest, LeaseUnavailable
from leases.tenancy import TenantGrant, tenant_access

from . import keys
from .key_forms import CreateKeyForm


def _projects(tenant: TenantGrant) -> list[str]:
    return tenant_access().projects(tenant.slug)


def _page(request: HttpRequest, tenant: TenantGrant, form: CreateKeyForm, *, created=None, plaintext=None,
          status: int = 200, error: str | None = None) -> HttpResponse:
    context = {
        "tenant": tenant, "form": form, "keys": keys.list_keys(tenant_id=tenant.slug),
        "created": created, "plaintext": plaintext, "error": error, "section": "api-keys",
    }
    response = render(request, "leases_api/keys.html", context, status=status)
    # The page may carry a plaintext key: never cache it anywhere.
    response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@tenant_admin_required
def key_list(request: HttpRequest, tenant: TenantGrant) -> HttpResponse:
    """GET: the tenant's keys and the create form. POST: create a key and show it once."""
    projects = _projects(tenant)
    if request.method == "GET":
        return _page(request, tenant, CreateKeyForm(projects=projects))
    form = CreateKeyForm(request.POST, projects=projects)
    if not form.is_valid():
        return _page(request, tenant, form, status=400)
    try:
        key, plaintext = keys.create_key(
            tenant_id=tenant.slug, project_id=form.cleaned_data["project"] or None,
            name=form.cleaned_data["name"], acting_user=request.user,
        )
    except InvalidLeaseRequest as exc:
        form.add_error(None, str(exc))
        return _page(request, tenant, form, status=400)
    except LeaseUnavailable as exc:
        return _page(request, tenant, form, status=503, error=str(exc))
    # Rendered, not redirected: the plaintext exists only in this one response.
    return _page(request, tenant, CreateKeyForm(projects=projects), created=key, plaintext=plaintext, status=201)


@require_POST
@tenant_admin_required
def key_revoke(request: HttpRequest, tenant: TenantGrant, prefix: str) -> HttpResponse:
    """POST (CSRF-checked): revoke one of the tenant's keys; it answers 401 from now on."""
    try:
        key = keys.revoke_key(tenant_id=tenant.slug, prefix=prefix, acting_user=request.user)
    except (ApiKeyNotFound, InvalidLeaseRequest):
        # Same answer for malformed, missing and other tenants' prefixes.
        raise Http404("No such API key") from None
    messages.success(request, f"API key {key.name} ({key.prefix}) revoked.")
    return redirect(reverse("api_keys:list", args=[tenant.slug]))
