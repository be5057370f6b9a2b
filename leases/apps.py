from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"
    verbose_name = "Resource leases"
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"

    def ready(self) -> None:
        # Issue 3: revocations go through the dispatcher (§6 matrix); the reference
        # consumers' handlers exist in every process, so any pod can run them.
        from django.core.signals import request_started

        from leases.conf import lease_settings

        from . import definitions, dispatch, invalidation, pod_renewer, tasks  # noqa: F401 - tasks wires the Celery worker signals
        from .contrib import register_handlers

        # The cache asks the subscription whether it may serve; without this it never caches.
        definitions.cache.attach(invalidation.liveness)
        dispatch.install()
        register_handlers()
        if lease_settings.POD_AUTOSTART:
            # Lazy: only a process that serves requests becomes a (web) pod, not migrate/shell.
            request_started.connect(pod_renewer.lazy_start_on_request, weak=False,
                                    dispatch_uid="leases.pod_renewer.lazy_start_on_request")
