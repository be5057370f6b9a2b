# --- django-leases ------------------------------------------------------------------------
import os

# The engine's MongoDB (pymongo). Unset, `manage.py check` says so (leases.E002).
MONGODB_URI = os.environ.get("MONGODB_URI", "")

INSTALLED_APPS += [  # noqa: F821 - appended to the generated settings.py
    "leases",
    "leases.api",
    "insights",
    "leases.contrib.jobs",  # the "tex" lease type's revocation handler
]
# Your databases stay as they are; the lease apps' models live on a MongoDB alias of their own.
DATABASES["leases"] = {"ENGINE": "django_mongodb_backend", "HOST": MONGODB_URI, "NAME": "hostsite_leases"}  # noqa: F821
DATABASE_ROUTERS = ["leases.routers.LeasesRouter"]  # beside your own routers, if you have any
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
