from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    verbose_name = "Lease API"
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"
