"""Insights → Leases views: parse the request, call :mod:`leases.ops.reads`, :mod:`leases.ops.actions` and
:mod:`leases.definitions.view`, render.

Access is decided by :func:`insights.access.tenant_admin_required`; the tenant's slug is
then passed to every service call, which binds it in the MongoDB filter.
"""

from __future__ import annotations

from urllib.parse import urlencode

import pymongo.errors
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from leases.conf import lease_settings
from leases.definitions import undefined, view as definition_views
from leases.errors import AuditEntryNotFound, HolderNotFound, InvalidLeaseRequest, LeaseUnavailable
from leases.ops import actions, reads
from leases.revocation import audit
from leases.tenancy import TenantGrant, tenant_access

from .access import grants_of, tenant_admin_required
from .forms import DefinitionForm, HolderFilterForm, RevokeForm

REFRESH_SECONDS = 5
PER_PAGE = 50


def _refresh_context(request: HttpRequest) -> dict:
    """Auto-refresh unless ``?refresh=off``; the fragment URL keeps every filter."""
    params = request.GET.copy()
    paused = params.get("refresh") == "off"
    params.pop("fragment", None)
    fragment_params = params.copy()
    fragment_params["fragment"] = "1"
    toggle = params.copy()
    if paused:
        toggle.pop("refresh", None)
    else:
        toggle["refresh"] = "off"
    return {
        "refresh_seconds": None if paused else REFRESH_SECONDS,
        "fragment_url": f"?{fragment_params.urlencode()}",
        "refresh_toggle_url": f"?{toggle.urlencode()}",
    }


def _project_slugs(tenant: TenantGrant) -> list[str]:
    return tenant_access().projects(tenant.slug)


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Start page: the tenants the user belongs to."""
    return render(request, "insights/home.html", {"grants": grants_of(request.user)})


@tenant_admin_required
def holders(request: HttpRequest, tenant: TenantGrant) -> HttpResponse:
    """Holders of the tenant with filters and paging."""
    form = HolderFilterForm(request.GET or None)
    page = None
    status = 200
    if not request.GET or form.is_valid():
        filters = form.service_filters() if request.GET else {"page": 1}
        try:
            page = reads.list_holders(tenant_id=tenant.slug, per_page=PER_PAGE, **filters)
        except InvalidLeaseRequest as exc:
            form.add_error(None, str(exc))
            status = 400
    else:
        status = 400
    active = form.active_filters() if request.GET else {}

    def page_url(number: int) -> str:
        return "?" + urlencode({**active, "page": number})

    context = {
        "tenant": tenant, "form": form, "page": page, "active_filters": active,
        "projects": _project_slugs(tenant), "section": "holders",
        "audit": audit.list_entries(tenant.slug, limit=5, actions=audit.REVOCATION_ACTIONS),
        "previous_url": page_url(page.page - 1) if page and page.has_previous else None,
        "next_url": page_url(page.page + 1) if page and page.has_next else None,
        **_refresh_context(request),
    }
    template = "insights/_holders_live.html" if request.GET.get("fragment") else "insights/holders.html"
    return render(request, template, context, status=status)


def _holders_url(tenant: TenantGrant, counter: reads.CounterView) -> str:
    return reverse("insights:holders", args=[tenant.slug]) + "?" + urlencode({"counter": counter.key})


@tenant_admin_required
def counters(request: HttpRequest, tenant: TenantGrant) -> HttpResponse:
    """Counters of the tenant, project and user levels with BOOKED and drift, and a flag
    on the resources whose (shared, unseen) global level is full."""
    rows = reads.list_counters(tenant_id=tenant.slug)
    full = reads.globally_full(r.resource for r in rows)
    context = {
        "tenant": tenant, "counters": [(r, r.resource in full, _holders_url(tenant, r)) for r in rows],
        "drift_count": sum(1 for r in rows if r.drift), "global_full": sorted(full),
        "section": "counters", **_refresh_context(request),
    }
    template = "insights/_counters_live.html" if request.GET.get("fragment") else "insights/counters.html"
    return render(request, template, context)


@tenant_admin_required
def waiting(request: HttpRequest, tenant: TenantGrant) -> HttpResponse:
    """The tenant's own waiting tickets per resource: place in the queue, since when, and
    the level that blocks each (the global level without its numbers)."""
    waiters = reads.list_waiters(tenant_id=tenant.slug)
    context = {
        "tenant": tenant, "waiters": waiters, "groups": waiters.by_resource(),
        "global_note": reads.GLOBAL_BLOCK_NOTE,
        "global_full": sorted(reads.globally_full({w.resource for w in waiters.items})),
        "section": "waiting", **_refresh_context(request),
    }
    template = "insights/_waiting_live.html" if request.GET.get("fragment") else "insights/waiting.html"
    return render(request, template, context)


@tenant_admin_required
def audit_entry(request: HttpRequest, tenant: TenantGrant, entry_id: str) -> HttpResponse:
    """One audit record of the tenant (a revocation: who, when, why, which holder)."""
    try:
        entry = audit.get_entry(entry_id, tenant_id=tenant.slug)
    except (AuditEntryNotFound, InvalidLeaseRequest):
        raise Http404("No such audit entry") from None
    return render(request, "insights/audit_entry.html",
                  {"tenant": tenant, "entry": entry, "section": "holders"})


@tenant_admin_required
def definition(request: HttpRequest, tenant: TenantGrant) -> HttpResponse:
    """The merged definition of a lease as an acquisition in one of the tenant's projects sees it."""
    projects = _project_slugs(tenant)
    form = DefinitionForm(request.GET or None, projects=projects)
    view = error = None
    status = 200
    if request.GET:
        if form.is_valid():
            try:
                view = definition_views.definition_view(form.cleaned_data["name"], tenant.slug, form.cleaned_data["project"])
            except LeaseUnavailable as exc:
                error = str(exc)
            except InvalidLeaseRequest as exc:
                form.add_error(None, str(exc))
                status = 400
        else:
            status = 400
    try:
        # Names this tenant acquired in the last hour that no layer defines (typos, usually).
        undefined_names = undefined.recent(tenant.slug)
    except pymongo.errors.PyMongoError:
        undefined_names = None  # the page still shows; the card says the list is unavailable
    context = {
        "tenant": tenant, "form": form, "view": view, "error": error, "section": "definition",
        "lease_names": reads.known_lease_names(tenant.slug), "undefined_names": undefined_names,
        "undefined_mode": lease_settings.UNDEFINED_LEASE,
    }
    return render(request, "insights/definition.html", context, status=status)


def _tenant_holder(tenant: TenantGrant, token: str) -> reads.HolderView:
    try:
        return reads.get_holder(token, tenant_id=tenant.slug)
    except (HolderNotFound, InvalidLeaseRequest):
        # Same answer for "never existed", "malformed" and "another tenant's token".
        raise Http404("No such lease holder") from None


@tenant_admin_required
def holder_detail(request: HttpRequest, tenant: TenantGrant, token: str) -> HttpResponse:
    """One holder of the tenant."""
    holder = _tenant_holder(tenant, token)
    return render(request, "insights/holder_detail.html",
                  {"tenant": tenant, "holder": holder, "section": "holders",
                   "definition_url": _definition_url(tenant, holder, _project_slugs(tenant))})


def _definition_url(tenant: TenantGrant, holder: reads.HolderView, projects: list[str]) -> str:
    """The definition tab for the holder's lease, seen from its project when Insights
    knows that project (else tenant-wide, which the form accepts)."""
    from leases.definitions.model import TENANT_PROJECT

    project = holder.project_id if holder.project_id in projects else TENANT_PROJECT
    return (reverse("insights:definition", args=[tenant.slug]) + "?"
            + urlencode({"name": holder.lease_name or holder.type, "project": project}))


@require_http_methods(["GET", "POST"])
@tenant_admin_required
def revoke(request: HttpRequest, tenant: TenantGrant, token: str) -> HttpResponse:
    """GET: the confirmation step. POST (CSRF-checked): revoke by operator decision."""
    if request.method == "POST":
        form = RevokeForm(request.POST)
        if form.is_valid():
            try:
                revoked = actions.revoke_holder(
                    token, tenant_id=tenant.slug, acting_user=request.user,
                    reason=form.cleaned_data["reason"] or "revoked in Insights",
                )
            except (HolderNotFound, InvalidLeaseRequest):
                raise Http404("No such lease holder") from None
            messages.success(
                request,
                f"Lease {revoked.token[:10]}… on {revoked.resource} revoked; its slots are free "
                f"and {_dispatch_note(revoked.type, revoked.pod, revoked.pod_bound)}.",
            )
            return redirect(reverse("insights:holders", args=[tenant.slug]))
        holder = _tenant_holder(tenant, token)
        return render(request, "insights/revoke_confirm.html",
                      {"tenant": tenant, "holder": holder, "form": form, "section": "holders",
                       "dispatch_note": _holder_dispatch_note(holder)}, status=400)
    holder = _tenant_holder(tenant, token)
    return render(request, "insights/revoke_confirm.html",
                  {"tenant": tenant, "holder": holder, "form": RevokeForm(), "section": "holders",
                   "dispatch_note": _holder_dispatch_note(holder)})


def _dispatch_note(handler_type: str, pod: str, pod_bound: bool) -> str:
    # Liveness read now: the dispatcher decides on the same definition right after the reap.
    from leases.pods import liveness as pod_liveness
    from leases.revocation import explain

    try:
        alive = pod_liveness.liveness.is_alive(pod)
    except pymongo.errors.PyMongoError:
        alive = False  # the dispatcher treats an unknown liveness as dead too
    return explain.dispatch_note(handler_type, pod, pod_bound, alive)


def _holder_dispatch_note(holder: reads.HolderView) -> str:
    from leases.revocation import explain

    return explain.dispatch_note(holder.type, holder.pod, holder.pod_bound, holder.pod_state == "alive")
