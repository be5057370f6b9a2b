from django.http import JsonResponse

import leases


def compile_view(request):
    """Acquire, check and release a "tex" lease around (pretend) work."""
    request_ = leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme", project_id="docs",
                                   user_id=request.user.get_username() or "anonymous")
    with leases.acquire(request_) as lease:
        lease.check()  # before each step of the work: raises LeaseLost if the lease was reaped
        token = lease.token
    return JsonResponse({"token": token, "released": True})


def hold_view(request):
    """Acquire a lease and keep it (detached), so Insights has a holder to show."""
    lease = leases.acquire(leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme", project_id="reports",
                                               user_id="bob", pod=""))
    return JsonResponse({"token": lease.token})


async def acompile_view(request):
    """The same from an async view: the lease runs on pymongo's async client."""
    request_ = leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme", project_id="docs", user_id="async")
    async with leases.aacquire(request_) as lease:
        await lease.acheck()
        token = lease.token
    return JsonResponse({"token": token, "released": True})
