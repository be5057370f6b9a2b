from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"
    verbose_name = "Resource leases"
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"

    def ready(self) -> None:
        # Issue 3: revocations go through the dispatcher (§6 matrix); the reference
        # consumers' handlers exist in every process, so any pod can run them.
        from django.core.signals import request_started

        from . import definitions, dispatch, invalidation, process, tasks  # noqa: F401 - tasks wires the Celery worker signals
        from .contrib import register_handlers

        # The subscription tells the cache what it learns; without this the cache never serves.
        # Its thread starts only where a process serves (leases.process), not here.
        invalidation.attach(definitions.cache)
        dispatch.install()
        register_handlers()
        # Lazy: only a process that serves requests starts its machinery, not migrate/shell.
        request_started.connect(process.on_request_started, weak=False,
                                dispatch_uid="leases.process.on_request_started")
