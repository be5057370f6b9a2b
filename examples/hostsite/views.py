"""Views of the example host: a lease around work, from a sync and an async view.

A busy resource is not a server error: the views answer ``429 Too Many Requests`` with
``Retry-After`` (the engine's estimate of the caller's turn, rounded up to whole seconds), so
a client backs off and retries instead of seeing a 500. A store that cannot decide
(``LeaseUnavailable``) answers 503: fail closed, the work does not run unprotected.
"""

import asyncio
import math

from django.http import JsonResponse

import leases


def _refused(error: leases.LeaseError) -> JsonResponse:
    """429 + Retry-After for a busy resource, 503 when the lease store cannot decide."""
    if isinstance(error, leases.LeaseBusy):
        response = JsonResponse({"code": error.code, "level": error.level, "scope": error.scope,
                                 "count": error.count, "cap": error.cap}, status=429)
        response["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
        return response
    response = JsonResponse({"code": error.code}, status=503)
    response["Retry-After"] = "5"
    return response


def compile_view(request):
    """Acquire, check and release a "tex" lease around (pretend) work; waits up to the lease's waitMs."""
    request_ = leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme", project_id="docs",
                                   user_id=request.user.get_username() or "anonymous")
    try:
        with leases.acquire(request_) as lease:
            lease.check()  # before each step of the work: raises LeaseLost if the lease was reaped
            token = lease.token
    except (leases.LeaseBusy, leases.LeaseUnavailable) as refused:
        return _refused(refused)
    return JsonResponse({"token": token, "released": True})


def hold_view(request):
    """Acquire a lease and keep it (detached), so Insights has a holder to show; never waits."""
    try:
        lease = leases.acquire(leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme", project_id="reports",
                                                   user_id="bob", pod="", wait_ms=0))
    except (leases.LeaseBusy, leases.LeaseUnavailable) as refused:
        return _refused(refused)
    return JsonResponse({"token": lease.token})


async def acompile_view(request):
    """The same from an async view: the lease runs on pymongo's async client."""
    request_ = leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme", project_id="docs", user_id="async")
    try:
        async with leases.aacquire(request_) as lease:
            await lease.acheck()
            token = lease.token
    except (leases.LeaseBusy, leases.LeaseUnavailable) as refused:
        return _refused(refused)
    return JsonResponse({"token": token, "released": True})


async def work_view(request):
    """Hold a lease of this process for ``?seconds=`` (at most 60) of (pretend) work, checking it
    every second: the lease belongs to this web process's pod, so no sweep reaps it while the
    process lives, however long the work takes."""
    seconds = min(60.0, float(request.GET.get("seconds", "1")))
    request_ = leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme", project_id="work", user_id="worker")
    try:
        async with leases.aacquire(request_) as lease:
            checks = 0
            while checks < seconds:
                await asyncio.sleep(1)
                await lease.acheck()  # raises LeaseLost if the lease was reaped or revoked meanwhile
                checks += 1
            token = lease.token
    except (leases.LeaseBusy, leases.LeaseUnavailable) as refused:
        return _refused(refused)
    return JsonResponse({"token": token, "checks": checks, "released": True})
