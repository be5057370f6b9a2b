from django.apps import AppConfig


class LeasesApiConfig(AppConfig):
    """HTTP lease protocol, API keys and the internal pod endpoints."""

    name = "leases.api"
    # A label of its own, so a host project's ``api`` app does not collide with ours.
    label = "leases_api"
    verbose_name = "Lease API"
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"
