"""Insights → Leases → History: the tenant's own minutes as SVG charts and tables.

Tenant binding is in the MongoDB filter (``tenantId`` = the tenant of the URL); the global
occupancy row (all tenants summed) is added for Django superusers only.
"""

from __future__ import annotations

import pymongo.errors
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from leases.errors import InvalidLeaseRequest
from leases.ops import history
from leases.tenancy import TenantGrant

from .access import tenant_admin_required
from .charts import history_charts, stacked_bars
from .views import _refresh_context

SINCE_CHOICES = ("30m", "1h", "6h", "24h")


@tenant_admin_required
def history_view(request: HttpRequest, tenant: TenantGrant) -> HttpResponse:
    """Per-minute grants, busy answers, waits, peak occupancy and reaps of one resource."""
    error = None
    status = 200
    data = charts = global_chart = None
    resources: list[str] = []
    since_raw = request.GET.get("since") or "1h"
    resource = request.GET.get("resource") or ""
    try:
        resources = history.resources(tenant.slug)
        since = history.parse_since(since_raw)
        if resource and resource not in resources:
            raise InvalidLeaseRequest(f"no history of resource {resource!r} in this tenant")
        resource = resource or (resources[0] if resources else "")
        if resource:
            data = history.query(resource, tenant_id=tenant.slug, since=since)
            reasons = sorted(data.totals.reaps) or ["idle"]
            charts = [(c, _table(c.key, data.rows, reasons)) for c in history_charts(data.rows, reasons)]
            if request.user.is_superuser:
                everyone = history.query(resource, tenant_id=None, since=since)
                global_chart = stacked_bars("global", "Global peak occupancy (all tenants summed, operators only)",
                                            everyone.rows, [("peak", "slots", "peak")], unit="slots")
    except InvalidLeaseRequest as exc:
        error, status = str(exc), 400
    except pymongo.errors.PyMongoError as exc:
        error, status = f"lease store unreachable ({exc.__class__.__name__})", 503
    context = {
        "tenant": tenant, "section": "history", "resources": resources, "resource": resource,
        "since": since_raw, "since_choices": SINCE_CHOICES, "data": data, "charts": charts,
        "global_chart": global_chart, "error": error, "keep_hours": history.history_hours(),
        **_refresh_context(request),
    }
    template = "insights/_history_live.html" if request.GET.get("fragment") else "insights/history.html"
    return render(request, template, context, status=status)


def _table(key: str, rows, reasons) -> tuple[list[str], list[list[object]]]:
    """The numbers of one chart, newest minute first, minutes with nothing to show left out."""
    def cells(r):
        if key == "grants":
            return [r.grants, r.busy] if r.grants or r.busy else None
        if key == "wait":
            return [r.waits, r.wait_p50_ms, r.wait_p95_ms] if r.waits else None
        if key == "peak":
            return [r.peak] if r.peak is not None else None
        return [r.reaps.get(x, 0) for x in reasons] if r.reaps else None

    headers = {"grants": ["granted", "busy"], "wait": ["waits", "p50 ms", "p95 ms"],
               "peak": ["peak slots"]}.get(key) or [f"reaped ({x})" for x in reasons]
    body = []
    for r in reversed(rows):
        c = cells(r)
        if c is not None:
            body.append([r.minute.strftime("%Y-%m-%d %H:%M")] + ["—" if v is None else v for v in c])
    return headers, body
