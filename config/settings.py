"""Django settings for the resource-lease system.

MongoDB (via django-mongodb-backend 5.2.x) is the only database.

Environment variables
=====================

| Variable                        | Setting                         | Default                        | Meaning                                                                 |
|---------------------------------|---------------------------------|--------------------------------|-------------------------------------------------------------------------|
| MONGODB_URI                     | MONGODB_URI                     | (dev stack's)                  | MongoDB connection string. Unset: the running dev stack's (var/devstack.json). |
| MONGODB_DB                      | MONGODB_DB                      | leases                         | Database name (tests use test_<MONGODB_DB>).                            |
| LEASES_DEVSTACK_RECORD          | (read by config.devstack)       | var/devstack.json              | Where the dev stack records its server for commands without MONGODB_URI. |
| DJANGO_SECRET_KEY               | SECRET_KEY                      | insecure dev key               | Django secret key. Must be set in production.                           |
| DJANGO_DEBUG                    | DEBUG                           | 1                              | "1"/"true"/"yes"/"on" enable debug mode; anything else disables it.     |
| DJANGO_ALLOWED_HOSTS            | ALLOWED_HOSTS                   | localhost,127.0.0.1,[::1]      | Comma-separated host names.                                             |
| DJANGO_CSRF_TRUSTED_ORIGINS     | CSRF_TRUSTED_ORIGINS            | (empty)                        | Comma-separated origins (scheme://host[:port]).                         |
| CELERY_BROKER_URL               | CELERY_BROKER_URL               | redis://127.0.0.1:6379/0       | Celery broker.                                                          |
| CELERY_RESULT_BACKEND           | CELERY_RESULT_BACKEND           | (none)                         | Celery result backend, e.g. redis://127.0.0.1:6379/2. Empty: disabled.  |
| LEASES_MONGO_TIMEOUT_MS         | LEASES_MONGO_TIMEOUT_MS         | 2000                           | Bound for server selection / connect / socket / operation timeouts.    |
| (settings only)                 | LEASES_DATABASE                 | default                        | Django alias (django-mongodb-backend) of the lease apps' models; see leases.routers. |
| LEASES_REAP_INTERVAL            | LEASES_REAP_INTERVAL            | 30                             | Seconds between "lease-sweep" beat runs.                                |
| LEASES_RECONCILE_SAFETY_MS      | LEASES_RECONCILE_SAFETY_MS      | 60000                          | Counter-reconcile safety margin (ms).                                   |
| LEASES_INTERNAL_SECRET          | LEASES_INTERNAL_SECRET          | insecure dev secret            | Shared secret for internal (pod-to-pod) endpoints.                      |
| LEASES_REDIS_URL                | LEASES_REDIS_URL                | redis://127.0.0.1:6379/1       | Redis for config-cache invalidation pub/sub.                            |
| POD_ID                          | POD_ID                          | (none: generated)              | Identity of this process/pod.                                           |
| LEASES_POD_ENDPOINT             | LEASES_POD_ENDPOINT             | (none)                         | URL this process is reachable at.                                       |
| LEASES_POD_INTERVAL_SECONDS     | LEASES_POD_INTERVAL_SECONDS     | 10                             | Pod heartbeat interval (s).                                             |
| LEASES_POD_INTERVAL_MIN         | LEASES_POD_INTERVAL_MIN         | 2                              | Minimum pod heartbeat interval (s).                                     |
| LEASES_POD_INTERVAL_MAX         | LEASES_POD_INTERVAL_MAX         | 60                             | Maximum pod heartbeat interval (s).                                     |
| LEASES_POD_EXPIRY_FACTOR        | LEASES_POD_EXPIRY_FACTOR        | 3                              | Pod expires after interval * factor without a heartbeat.                |
| LEASES_DEFINITION_CACHE_SECONDS | LEASES_DEFINITION_CACHE_SECONDS | 300                            | Max age of the in-process lease-definition cache (s).                   |
| LEASES_INVALIDATION_LIVENESS_MS | LEASES_INVALIDATION_LIVENESS_MS | 2000                           | Cache hits need a Redis ping answered this recently (100-2000 ms).      |
| LEASES_UNDEFINED_LEASE          | LEASES_UNDEFINED_LEASE          | noop                           | A lease name no layer defines: "noop" (NOOP, unlimited) or "error" (UNKNOWN_LEASE). |
| LEASES_POD_AUTOSTART            | LEASES_POD_AUTOSTART            | 1                              | Web processes register as pods on their first request (tests: off).    |
| LEASES_WORKER_INTERNAL_BIND     | LEASES_WORKER_INTERNAL_BIND     | 127.0.0.1:0                    | host:port a Celery worker serves /internal/lease/ on (0 = free port).  |
| LEASES_SESSION_TOOLS            | LEASES_SESSION_TOOLS            | {}                             | JSON {tool: {endpoint, auth}} for leases.contrib.sessions.             |
| (settings only)                 | LEASES_TENANT_ACCESS            | insights.access.ModelTenantAccess | Dotted path of the tenancy hook (a leases.tenancy.TenantAccess).     |
| LEASES_HTTP_MAX_WAIT_MS         | LEASES_HTTP_MAX_WAIT_MS         | 5000                           | Upper bound (ms) of an HTTP acquire's wait for a slot (then 202 ticket). |
| LEASES_HTTP_LONG_POLLS          | LEASES_HTTP_LONG_POLLS          | 4                              | Ticket polls (?waitMs=) waiting for their grant at once, per process (each holds a thread). |
| LEASES_TICKET_TTL_MS            | LEASES_TICKET_TTL_MS            | 3000                           | A waiting ticket not kept alive this long is dropped (dead waiter).    |
| LEASES_WAIT_POLL_MS             | LEASES_WAIT_POLL_MS             | 1000                           | A waiter's keep-alive and safety poll when no wake-up comes (ms).      |
| LEASES_REPAIR_INTERVAL_MS       | LEASES_REPAIR_INTERVAL_MS       | 500                            | How often one full counter is checked for slots no holder books (ms).  |
| LEASES_TICKET_POLL_SECONDS      | LEASES_TICKET_POLL_SECONDS      | 2                              | Poll interval issued with an HTTP wait ticket (202); kept 3x as long.   |
| LEASES_RETRY_AFTER_MIN_MS       | LEASES_RETRY_AFTER_MIN_MS       | 100                            | The least LeaseBusy.retry_after the engine suggests (ms): no spinning. |
| LEASES_HISTORY_HOURS            | LEASES_HISTORY_HOURS            | 24                             | Per-minute lease history (grants, busy, waits, reaps) is kept this long (TTL index). |
| LEASES_HISTORY_FLUSH_SECONDS    | LEASES_HISTORY_FLUSH_SECONDS    | 5                              | Each process writes its buffered history this often, in one bulk write (0: only at exit). |
| LEASES_METRICS_NAMESPACE        | LEASES_METRICS_NAMESPACE        | vance                          | Prefix of every lease metric (<namespace>_lease_*); read once per process start. |
| PROMETHEUS_MULTIPROC_DIR        | (read by prometheus_client)     | (none: one registry a process) | Shared directory of this host's processes' metric files; /metrics adds them up. |
| DJANGO_STATIC_ROOT              | STATIC_ROOT                     | <project>/staticfiles          | collectstatic target.                                                   |
| DJANGO_LOG_LEVEL                | LOGGING root level              | INFO                           | Root log level.                                                         |
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def _env_bool(name: str, default: str) -> bool:
    return os.environ.get(name, default).strip().lower() in {"1", "true", "yes", "on"}


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc


def _env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


BASE_DIR = Path(__file__).resolve().parent.parent

# --- Core -------------------------------------------------------------------------------

SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "django-insecure-dev-only-key-change-me-in-production-0123456789"
)
DEBUG = _env_bool("DJANGO_DEBUG", "1")
ALLOWED_HOSTS = _env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = _env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    # Mongo-flavoured AppConfigs (ObjectIdAutoField pks), per the django-mongodb-project
    # 5.2.x template.
    "config.apps.MongoAdminConfig",
    "config.apps.MongoAuthConfig",
    "config.apps.MongoContentTypesConfig",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "leases",
    "insights",
    "leases.api",
    # The reference consumers (the demo's ``tex`` and ``browser`` types): opt-in apps.
    "leases.contrib.jobs",
    "leases.contrib.sessions",
]

# Contrib apps' own migrations use AutoField; these MongoDB-specific ones (generated with
# `manage.py makemigrations admin auth contenttypes`, as the template ships them) use
# ObjectIdAutoField.
MIGRATION_MODULES = {
    "admin": "config.mongo_migrations.admin",
    "auth": "config.mongo_migrations.auth",
    "contenttypes": "config.mongo_migrations.contenttypes",
}

DEFAULT_AUTO_FIELD = "django_mongodb_backend.fields.ObjectIdAutoField"

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "config" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database: MongoDB only ---------------------------------------------------------------

MONGODB_URI = os.environ.get("MONGODB_URI", "").strip()
MONGODB_DB = os.environ.get("MONGODB_DB", "").strip()
LEASES_MONGO_TIMEOUT_MS = _env_int("LEASES_MONGO_TIMEOUT_MS", 2000)

if not MONGODB_URI:
    # A second terminal next to `bash scripts/dev.sh` has no MONGODB_URI: use the server the
    # running dev stack recorded (its embedded server listens on a port chosen at start-up).
    from config.devstack import no_server_message, recorded_server

    _devstack = recorded_server()
    if _devstack is None:
        raise ImproperlyConfigured(no_server_message())
    MONGODB_URI = _devstack.mongodb_uri
    MONGODB_DB = MONGODB_DB or _devstack.mongodb_db
MONGODB_DB = MONGODB_DB or "leases"

# HOST=<uri>: the one form both django-mongodb-backend 5.2 and 6.1 take (6.x removed parse_uri).
DATABASES = {
    "default": {
        "ENGINE": "django_mongodb_backend",
        "HOST": MONGODB_URI,
        "NAME": MONGODB_DB,
        "OPTIONS": {
            # A down MongoDB answers within LEASES_MONGO_TIMEOUT_MS instead of 30 s.
            "serverSelectionTimeoutMS": LEASES_MONGO_TIMEOUT_MS,
            "connectTimeoutMS": LEASES_MONGO_TIMEOUT_MS,
            "socketTimeoutMS": LEASES_MONGO_TIMEOUT_MS,
        },
        "TEST": {"NAME": f"test_{MONGODB_DB}"},
    }
}

# Sessions live in MongoDB too (django_session collection).
SESSION_ENGINE = "django.contrib.sessions.backends.db"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# --- I18N / static ------------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = os.environ.get("DJANGO_STATIC_ROOT", str(BASE_DIR / "staticfiles"))

# --- Celery ------------------------------------------------------------------------------

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", "").strip() or None
CELERY_TASK_IGNORE_RESULT = CELERY_RESULT_BACKEND is None
CELERY_TIMEZONE = TIME_ZONE
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- Leases ------------------------------------------------------------------------------

LEASES_REAP_INTERVAL = _env_int("LEASES_REAP_INTERVAL", 30)
LEASES_RECONCILE_SAFETY_MS = _env_int("LEASES_RECONCILE_SAFETY_MS", 60000)
LEASES_INTERNAL_SECRET = os.environ.get(
    "LEASES_INTERNAL_SECRET", "insecure-dev-internal-secret-change-me"
)
LEASES_REDIS_URL = os.environ.get("LEASES_REDIS_URL", "redis://127.0.0.1:6379/1")
POD_ID = os.environ.get("POD_ID", "").strip() or None
LEASES_POD_ENDPOINT = os.environ.get("LEASES_POD_ENDPOINT", "").strip() or None
LEASES_POD_INTERVAL_SECONDS = _env_int("LEASES_POD_INTERVAL_SECONDS", 10)
LEASES_POD_INTERVAL_MIN = _env_int("LEASES_POD_INTERVAL_MIN", 2)
LEASES_POD_INTERVAL_MAX = _env_int("LEASES_POD_INTERVAL_MAX", 60)
LEASES_POD_EXPIRY_FACTOR = _env_int("LEASES_POD_EXPIRY_FACTOR", 3)
# A lease name no layer defines (a typo?): "noop" acquires NOOP (the spec), "error" raises
# UnknownLease (UNKNOWN_LEASE); `manage.py check` refuses other values (leases.E020).
LEASES_UNDEFINED_LEASE = os.environ.get("LEASES_UNDEFINED_LEASE", "").strip() or "noop"
LEASES_DEFINITION_CACHE_SECONDS = _env_int("LEASES_DEFINITION_CACHE_SECONDS", 300)
# When a lease answered by a hand-off marks its holder HELD (0: at once); `check` bounds it.
LEASES_GRANT_MARK_DELAY_MS = _env_int("LEASES_GRANT_MARK_DELAY_MS", 50)
# Acquire steps a process runs against the store at once; the rest wait their turn.
LEASES_STORE_CONCURRENCY = _env_int("LEASES_STORE_CONCURRENCY", 2)
LEASES_INVALIDATION_LIVENESS_MS = _env_int("LEASES_INVALIDATION_LIVENESS_MS", 2000)
if not 100 <= LEASES_INVALIDATION_LIVENESS_MS <= 2000:
    # Longer would let a frozen Redis keep stale caps in force for longer.
    raise ImproperlyConfigured(
        f"LEASES_INVALIDATION_LIVENESS_MS must be between 100 and 2000, got {LEASES_INVALIDATION_LIVENESS_MS}"
    )
LEASES_POD_AUTOSTART = _env_bool("LEASES_POD_AUTOSTART", "1")
LEASES_WORKER_INTERNAL_BIND = os.environ.get("LEASES_WORKER_INTERNAL_BIND", "127.0.0.1:0").strip() or "127.0.0.1:0"
try:
    import json as _json

    LEASES_SESSION_TOOLS = _json.loads(os.environ.get("LEASES_SESSION_TOOLS", "").strip() or "{}")
except ValueError as _exc:
    raise ImproperlyConfigured(f"LEASES_SESSION_TOOLS must be JSON: {_exc}") from _exc
# HTTP acquire waits at most this long for a slot (then a 202 ticket), so a web worker is never held
# for a definition's full waitMs; keep it well below the server's request timeout.
LEASES_HTTP_MAX_WAIT_MS = _env_int("LEASES_HTTP_MAX_WAIT_MS", 5000)
LEASES_HTTP_LONG_POLLS = _env_int("LEASES_HTTP_LONG_POLLS", 4)
LEASES_TICKET_TTL_MS = _env_int("LEASES_TICKET_TTL_MS", 3000)
LEASES_WAIT_POLL_MS = _env_int("LEASES_WAIT_POLL_MS", 1000)
LEASES_REPAIR_INTERVAL_MS = _env_int("LEASES_REPAIR_INTERVAL_MS", 500)
# An HTTP acquire that outwaits that bound answers 202 with a ticket: the client polls it
# every this many seconds, and a ticket not polled for three intervals is dropped.
LEASES_TICKET_POLL_SECONDS = _env_int("LEASES_TICKET_POLL_SECONDS", 2)
LEASES_RETRY_AFTER_MIN_MS = _env_int("LEASES_RETRY_AFTER_MIN_MS", 100)
if not 1 <= LEASES_TICKET_POLL_SECONDS <= 60:
    raise ImproperlyConfigured(f"LEASES_TICKET_POLL_SECONDS must be between 1 and 60, got {LEASES_TICKET_POLL_SECONDS}")
# History documents expire through a TTL index on the server's clock; a changed value is
# applied to the existing index (collMod) the next time a process ensures its indexes.
LEASES_HISTORY_HOURS = _env_int("LEASES_HISTORY_HOURS", 24)
if LEASES_HISTORY_HOURS < 1:
    raise ImproperlyConfigured(f"LEASES_HISTORY_HOURS must be at least 1, got {LEASES_HISTORY_HOURS}")
LEASES_HISTORY_FLUSH_SECONDS = _env_int("LEASES_HISTORY_FLUSH_SECONDS", 5)
# Lease metrics are named <namespace>_lease_*; the default keeps the platform's vance_lease_*.
LEASES_METRICS_NAMESPACE = os.environ.get("LEASES_METRICS_NAMESPACE", "").strip() or "vance"

CELERY_BEAT_SCHEDULE = {
    "lease-sweep": {
        "task": "leases.tasks.sweep",
        "schedule": float(LEASES_REAP_INTERVAL),
        # A run still queued when the next is due is dropped (the next does the same work),
        # so a stalled worker does not face a backlog of sweeps when it comes back.
        "options": {"expires": LEASES_REAP_INTERVAL * 0.9},
    },
}

# --- Logging -----------------------------------------------------------------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "default": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "default"},
    },
    "root": {"handlers": ["console"], "level": os.environ.get("DJANGO_LOG_LEVEL", "INFO")},
    # Django's own console handler (DEBUG only) would print every django.* record a second
    # time next to the root handler: its records go to the root handler alone.
    "loggers": {"django": {"handlers": [], "propagate": True}},
}
