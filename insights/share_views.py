"""Insights → Leases → Shares: the tenant's weight and classes on a lease, and the weights of
its projects. Every member of the tenant may read them; its admins set the project weights
here (written to the Tenant layer, audited)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from django.views.defaults import permission_denied

from leases import definitions, reads, shares
from leases.definitions import TENANT_PROJECT
from leases.errors import InvalidLeaseRequest, LeaseUnavailable
from leases.tenancy import TenantGrant, tenant_access
from leases.validation import ID_RE

from .forms import DefinitionForm, ProjectWeightForm
from .views import _project_slugs


def resolve_member_tenant(request: HttpRequest, tenant_slug: str) -> TenantGrant:
    """The tenant named by ``tenant_slug`` if the tenancy hook says ``request.user`` is one
    of its members (any role); the admin check of the other pages, without the role.

    Raises:
        Http404: malformed slug, no such tenant, or the user is not a member (a stranger
            cannot tell an existing tenant from a missing one).
    """
    # The slug is checked before it reaches the hook, so "$ne"-like values are just 404s.
    if not isinstance(tenant_slug, str) or ID_RE.fullmatch(tenant_slug) is None:
        raise Http404("No such tenant")
    granted = tenant_access().grant(request.user, tenant_slug)
    # A hook answering for another tenant than asked would bind the page to it.
    if granted is None or granted.slug != tenant_slug:
        raise Http404("No such tenant")
    return granted


def tenant_member_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Decorate a view taking ``tenant`` from the URL that every member of the tenant may
    see; it receives the :class:`TenantGrant` (whose role the view checks before a write)."""

    @wraps(view)
    def wrapper(request: HttpRequest, tenant: str, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        return view(request, resolve_member_tenant(request, tenant), *args, **kwargs)

    return wrapper


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
