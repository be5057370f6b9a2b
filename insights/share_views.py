"""Insights → Leases → Shares: the tenant's weight and classes on a lease, and the weights of
its projects. Every member of the tenant may read them; its admins set the project weights
here (written to the Tenant layer, audited)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from django.views.defaults import permission_denied

from leases.definitions import model as definitions
from leases.definitions.model import TENANT_PROJECT
from leases.errors import InvalidLeaseRequest, LeaseUnavailable
from leases.ops import reads
from leases.queue import shares
from leases.tenancy import TenantGrant

from .access import tenant_member_required
from .forms import DefinitionForm, ProjectWeightForm
from .views import _project_slugs


def _share_context(tenant: TenantGrant, name: str, projects: list[str]) -> dict:
    """What this tenant may know of a lease's shares: its own weight and classes, its
    projects' weights — never another tenant's weight or classes."""
    definition = definitions.load(name, tenant.slug, TENANT_PROJECT)
    return {
        "lease": name,
        "tenant_weight": definition.tenant_weight(tenant.slug),
        "tenant_weight_layer": definition.sources.get("shares.tenants", "default")
        if tenant.slug in definition.tenant_shares else "default",
        "classes": list(definition.classes_for(tenant.slug)),
        "all_classes": list(definition.priorities),
        "default_class": definition.default_priority,
        "max_starvation_ms": definition.max_starvation_ms,
        "project_weights": [(p, definition.project_weight(p), p in definition.project_shares) for p in projects],
        "project_layer": definition.sources.get("shares.projects"),
    }


@require_http_methods(["GET", "POST"])
@tenant_member_required
def shares_view(request: HttpRequest, tenant: TenantGrant) -> HttpResponse:
    """GET ?name=<lease>: the shares (any member); POST (CSRF-checked, tenant admins only):
    set one project's weight."""
    if request.method == "POST" and not tenant.is_admin:
        # Refused before the form is even read: a member's POST writes nothing. Rendered
        # here, as the admin-only pages do, so Django logs one "Forbidden" line.
        return permission_denied(request, PermissionDenied("Setting project weights is for the tenant's admins"))
    projects = _project_slugs(tenant)
    status = 200
    weight_form = None
    if request.method == "POST":
        weight_form = ProjectWeightForm(request.POST, projects=projects)
        if weight_form.is_valid():
            data = weight_form.cleaned_data
            try:
                shares.set_project_weight(tenant.slug, data["name"], data["project"], data["weight"],
                                          acting_user=request.user)
            except (InvalidLeaseRequest, LeaseUnavailable) as exc:
                weight_form.add_error(None, str(exc))
            else:
                shown = "the default 1" if data["weight"] is None else f"{data['weight']:g}"
                messages.success(request, f"Project {data['project']} now weighs {shown} within "
                                          f"{tenant.slug}'s share of {data['name']}.")
                url = reverse("insights:shares", args=[tenant.slug]) + "?" + urlencode({"name": data["name"]})
                return redirect(url)
        status = 400
        name = request.POST.get("name", "")
    else:
        name = request.GET.get("name", "")
    picker = DefinitionForm({"name": name, "project": TENANT_PROJECT} if name else None, projects=projects)
    context = {"tenant": tenant, "section": "shares", "picker": picker, "error": None, "share": None,
               "lease_names": reads.known_lease_names(tenant.slug), "weight_form": None,
               "member_only": not tenant.is_admin}
    if name and picker.is_valid():
        try:
            context["share"] = _share_context(tenant, picker.cleaned_data["name"], projects)
        except LeaseUnavailable as exc:
            context["error"] = str(exc)
        if tenant.is_admin:  # the form only for those whose POST is accepted
            context["weight_form"] = weight_form or ProjectWeightForm(
                initial={"name": picker.cleaned_data["name"]}, projects=projects)
    elif name:
        status = 400
    return render(request, "insights/shares.html", context, status=status)
