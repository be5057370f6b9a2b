from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"
    verbose_name = "Resource leases"
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"

    def ready(self) -> None:
        # Revocations go through the dispatcher. Handlers are the host's (or the opt-in
        # leases.contrib apps'): the engine registers none of its own.
        from django.core.signals import request_started

        from leases.conf import lease_settings

        from . import checks, definitions, dispatch, invalidation, pod_renewer, tasks  # noqa: F401 - checks registers, tasks wires the Celery worker signals

        # The cache asks the subscription whether it may serve; without this it never caches.
        definitions.cache.attach(invalidation.liveness)
        dispatch.install()
        if lease_settings.POD_AUTOSTART:
            # Lazy: only a process that serves requests becomes a (web) pod, not migrate/shell.
            request_started.connect(pod_renewer.lazy_start_on_request, weak=False,
                                    dispatch_uid="leases.pod_renewer.lazy_start_on_request")
