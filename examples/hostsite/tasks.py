from celery import shared_task

from leases.contrib.celery import leased


@shared_task(bind=True)
@leased("tex", lease="tex", tenant="tenant_id", project="project_id", user="user_id")
def compile_pdf(self, tenant_id, project_id, user_id, *, lease):
    """Runs under a "tex" lease: acquired before the body, released after it."""
    lease.check()
    return {"token": lease.token}
