from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"
    verbose_name = "Resource leases"
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"

    def ready(self) -> None:
        # Revocations go through the dispatcher. Handlers are the host's (or the opt-in
        # leases.contrib apps'): the engine registers none of its own.
        from django.core.signals import request_started

        from . import checks  # noqa: F401 - checks registers, tasks wires the Celery worker signals
        from .definitions import invalidation, model as definitions
        from .pods import process
        from .revocation import dispatch
        from .upkeep import tasks  # noqa: F401

        # The subscription tells the cache what it learns; without this the cache never serves.
        # Its thread starts only where a process serves (leases.pods.process), not here.
        invalidation.attach(definitions.cache)
        dispatch.install()
        # Lazy: only a process that serves requests starts its machinery, not migrate/shell.
        request_started.connect(process.on_request_started, weak=False,
                                dispatch_uid="leases.pods.process.on_request_started")
