"""Test settings: everything from config.settings, tuned for speed and isolation.

When MONGODB_URI is unset, importing this module starts ONE in-memory embedded SecantusDB
server (a separate process) and exports MONGODB_URI before config.settings reads it. This
has to happen here: pytest-django imports the settings module in its
pytest_load_initial_conftests hook, i.e. before any conftest.py is imported. Child
processes inherit MONGODB_URI and reuse the server. tests/conftest.py stops it at the end
of the session (an atexit hook and PR_SET_PDEATHSIG are the fallbacks).
"""

from leases.store.embedded import ensure_test_server

ensure_test_server()

from .settings import *  # noqa: E402, F403

DEBUG = False
SECRET_KEY = "test-secret-key-not-for-production"
LEASES_INTERNAL_SECRET = "test-internal-secret"
ALLOWED_HOSTS = ["*"]

# Fast hashing for test users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Celery tasks run inline, no broker needed.
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BROKER_URL = "memory://"
CELERY_RESULT_BACKEND = None

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

LOGGING["root"]["level"] = "WARNING"  # noqa: F405

# The crash-window tests stop the engine inside a window (leases.engine.pausepoints); off elsewhere.
LEASES_TEST_PAUSE_POINTS = True

# Pods: tests start the pod lease renewal explicitly (no thread on the first test request).
LEASES_POD_AUTOSTART = False

# History: no flusher thread; tests flush explicitly (leases.telemetry.history.flush) when they read it.
LEASES_HISTORY_FLUSH_SECONDS = 0
