import time

from celery import shared_task

from leases.contrib.celery import leased


@shared_task(bind=True)
@leased("tex", lease="tex", tenant="tenant_id", project="project_id", user="user_id")
def compile_pdf(self, tenant_id, project_id, user_id, *, lease):
    """Runs under a "tex" lease: acquired before the body, released after it."""
    lease.check()
    return {"token": lease.token}


@shared_task(bind=True)
@leased("tex", lease="tex", tenant="tenant_id", project="project_id", user="user_id")
def long_compile(self, tenant_id, project_id, user_id, seconds, *, lease):
    """Holds its lease for ``seconds`` of work, checking it every second (the worker's pod keeps it)."""
    for _ in range(int(seconds)):
        time.sleep(1)
        lease.check()
    return {"token": lease.token}
