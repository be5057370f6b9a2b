"""URLs of an ASGI view that uses the async lease API (tests/engine/test_aio.py routes here)."""

from django.http import JsonResponse
from django.urls import path

import leases


async def render(request, tenant: str, user: str):
    """A view an ASGI host would write: hold the lease while the work runs."""
    req = leases.LeaseRequest(type="aiotest", lease="aio", tenant_id=tenant, project_id="p1", user_id=user)
    try:
        async with leases.aacquire(req) as lease:
            await lease.acheck()
            return JsonResponse({"token": lease.token, "levels": lease.levels})
    except leases.LeaseBusy as busy:
        return JsonResponse({"code": busy.code, "level": busy.level}, status=429)


urlpatterns = [path("aio/<str:tenant>/<str:user>", render)]
