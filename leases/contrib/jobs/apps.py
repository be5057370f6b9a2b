from django.apps import AppConfig


class JobsConfig(AppConfig):
    """Opt-in app: the ``tex`` poll-loop job tracker and its revocation handler."""

    name = "leases.contrib.jobs"
    # Not "jobs": a host project may well have an app of that name.
    label = "leases_jobs"
    verbose_name = "Lease reference consumer: jobs"

    def ready(self) -> None:
        # Every process of the host (web, worker) registers the handler, so whichever pod
        # reaps a lost ``tex`` lease can run it.
        from leases.revocation.handlers import register_handler

        from . import JobHandler

        register_handler(JobHandler())
