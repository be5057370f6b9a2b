# --- django-leases ------------------------------------------------------------------------
import os

MONGODB_URI = os.environ["MONGODB_URI"]  # the engine's MongoDB (pymongo)

INSTALLED_APPS += [  # noqa: F821 - appended to the generated settings.py
    "leases",
    "leases.api",
    "insights",
    "leases.contrib.jobs",  # the "tex" lease type's revocation handler
]
DATABASES = {
    # The host's own database stays PostgreSQL ...
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "test",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    },
    # ... and the lease apps' models live on a MongoDB alias of their own.
    "leases": {"ENGINE": "django_mongodb_backend", "HOST": MONGODB_URI, "NAME": "hostsite_leases"},
}
DATABASE_ROUTERS = ["leases.routers.LeasesRouter"]
LEASES_DATABASE = "leases"
LEASES_TENANT_ACCESS = "hostsite.tenancy.GroupTenantAccess"
LEASES_INTERNAL_SECRET = os.environ.get("LEASES_INTERNAL_SECRET", "change-me-to-a-long-random-value")

# Celery: hostsite/celery.py is the app; the worker imports the lease tasks with the host's.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/3")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/3")
CELERY_IMPORTS = ["hostsite.tasks"]

# Celery beat (run exactly one) schedules the sweep: idle and dead-pod reaps, counter reconcile.
LEASES_REAP_INTERVAL = int(os.environ.get("LEASES_REAP_INTERVAL", "30"))
CELERY_BEAT_SCHEDULE = {
    "lease-sweep": {
        "task": "leases.tasks.sweep",
        "schedule": float(LEASES_REAP_INTERVAL),
        # A run still queued when the next is due is dropped: the next does the same work.
        "options": {"expires": LEASES_REAP_INTERVAL * 0.9},
    },
}
