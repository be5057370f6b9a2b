"""Django system checks for the lease apps: production mistakes fail ``manage.py check``.

Errors (``leases.E…``) stop ``migrate``, ``runserver`` and every command that runs the
checks; warnings (``leases.W…``) are printed. Nothing here connects to a server: the checks
judge the settings alone, so they answer the same on a machine without MongoDB or Redis.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from leases.conf import INSECURE_INTERNAL_SECRET, lease_settings

TAG = "leases"
# Shorter shared secrets are guessable offline from one captured pod-to-pod request.
MIN_SECRET_LENGTH = 32


def _int(name: str, errors: list) -> int | None:
    value = getattr(lease_settings, name)
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(Error(f"LEASES_{name} must be an integer, got {value!r}", id="leases.E010"))
        return None
    return value


@register(TAG, Tags.security)
def check_internal_secret(app_configs: Any = None, **kwargs: Any) -> list:
    """The pod-to-pod secret: never the shipped default (or empty) outside DEBUG."""
    secret = lease_settings.INTERNAL_SECRET
    if not isinstance(secret, str) or not secret:
        return [Error("LEASES_INTERNAL_SECRET is empty: every pod-to-pod call would be refused or forgeable",
                      hint="Set it to the same long random value on every pod.", id="leases.E001")]
    if settings.DEBUG:
        return []
    if secret == INSECURE_INTERNAL_SECRET:
        return [Error("LEASES_INTERNAL_SECRET is the shipped default while DEBUG is off: anyone who read the "
                      "source can revoke leases through /internal/lease/",
                      hint="Set LEASES_INTERNAL_SECRET to a long random value (python -c \"import secrets; "
                           "print(secrets.token_urlsafe(48))\"), the same on every pod.", id="leases.E001")]
    if len(secret) < MIN_SECRET_LENGTH:
        return [Warning(f"LEASES_INTERNAL_SECRET has fewer than {MIN_SECRET_LENGTH} characters",
                        hint="Use a long random value, e.g. secrets.token_urlsafe(48).", id="leases.W001")]
    return []


def _uri_options(uri: str) -> dict[str, str]:
    """The URI's query options, names lower-cased (MongoDB URI options are case-insensitive)."""
    return {key.lower(): value for key, value in parse_qsl(urlsplit(uri).query, keep_blank_values=True)}


# Not tagged Tags.database: these checks read settings only (no server is contacted), and
# Django 6 runs database-tagged checks only under `check --database`, so with that tag an
# unset MONGODB_URI would pass a plain `manage.py check` unnoticed.
@register(TAG)
def check_mongodb_uri(app_configs: Any = None, **kwargs: Any) -> list:
    """``MONGODB_URI`` is set, parses, and asks for nothing the engine cannot live with."""
    uri = lease_settings.MONGODB_URI
    if not uri:
        return [Error("MONGODB_URI is not set: the lease engine has no MongoDB to talk to",
                      hint="Set MONGODB_URI to your replica set's connection string "
                           "(mongodb://host1,host2,host3/?replicaSet=rs0 or mongodb+srv://...).",
                      id="leases.E002")]
    if not uri.startswith(("mongodb://", "mongodb+srv://")):
        return [Error("MONGODB_URI must begin with mongodb:// or mongodb+srv://", id="leases.E003")]
    if not uri.startswith("mongodb+srv://"):
        # An SRV URI would need a DNS lookup to parse fully; the checks stay offline.
        from pymongo.errors import ConfigurationError, InvalidURI
        from pymongo.uri_parser import parse_uri

        try:
            parse_uri(uri)
        except (InvalidURI, ConfigurationError, ValueError) as exc:
            return [Error(f"MONGODB_URI does not parse: {exc}", id="leases.E003")]
    return _replica_set_warnings(_uri_options(uri))


def _replica_set_warnings(options: dict[str, str]) -> list:
    """Where the URI asks for less than the engine needs (the engine overrides it, but say so)."""
    warnings = []
    write_concern = options.get("w")
    if write_concern is not None and write_concern != "majority":
        warnings.append(Warning(
            f"MONGODB_URI sets w={write_concern}; the engine writes with w=majority regardless",
            hint="A grant acknowledged by fewer than a majority can be rolled back by a failover; "
                 "drop w= from the URI (the ORM alias shares it) or set w=majority.", id="leases.W002"))
    read_preference = options.get("readpreference")
    if read_preference is not None and read_preference != "primary":
        warnings.append(Warning(
            f"MONGODB_URI sets readPreference={read_preference}; the engine reads from the primary regardless",
            hint="Counters and holders read from a lagging secondary could exceed a cap.", id="leases.W003"))
    for name in ("retrywrites", "retryreads"):
        if options.get(name, "").lower() == "false":
            warnings.append(Warning(
                f"MONGODB_URI sets {name}=false; the engine retries once across a failover regardless",
                hint="Without retries every primary election surfaces as LeaseUnavailable.", id="leases.W004"))
    return warnings


@register(TAG, deploy=True)
def check_mongodb_deploy(app_configs: Any = None, **kwargs: Any) -> list:
    """``check --deploy``: a production URI should reach a replica set, not one member."""
    uri = lease_settings.MONGODB_URI
    if not uri or uri.startswith("mongodb+srv://"):
        return []
    options = _uri_options(uri)
    if options.get("directconnection", "").lower() == "true" or "replicaset" not in options:
        return [Warning("MONGODB_URI names no replicaSet (or forces directConnection): the engine will not "
                        "follow a failover to a new primary",
                        hint="Use mongodb://host1,host2,host3/?replicaSet=<name> or an Atlas mongodb+srv:// URI.",
                        id="leases.W005")]
    return []


@register(TAG)
def check_redis_url(app_configs: Any = None, **kwargs: Any) -> list:
    """``LEASES_REDIS_URL`` parses (invalidation and wake-ups connect to it lazily)."""
    from redis.connection import parse_url

    url = lease_settings.REDIS_URL
    try:
        if not isinstance(url, str):
            raise ValueError(f"expected a string, got {type(url).__name__}")
        parse_url(url)
    except ValueError as exc:
        return [Error(f"LEASES_REDIS_URL {url!r} does not parse: {exc}",
                      hint="e.g. redis://127.0.0.1:6379/1, rediss://host:6380/0 or unix:///run/redis.sock",
                      id="leases.E004")]
    return []


@register(TAG)
def check_intervals(app_configs: Any = None, **kwargs: Any) -> list:
    """Pod heartbeat bounds, cache liveness, ticket polling and history keep in range."""
    errors: list = []
    low, high, interval = _int("POD_INTERVAL_MIN", errors), _int("POD_INTERVAL_MAX", errors), _int(
        "POD_INTERVAL_SECONDS", errors)
    if low is not None and high is not None:
        if low <= 0:
            errors.append(Error(f"LEASES_POD_INTERVAL_MIN must be positive, got {low}", id="leases.E005"))
        elif low > high:
            errors.append(Error(f"LEASES_POD_INTERVAL_MIN ({low}) is greater than LEASES_POD_INTERVAL_MAX ({high})",
                                id="leases.E005"))
        elif interval is not None and not low <= interval <= high:
            errors.append(Error(f"LEASES_POD_INTERVAL_SECONDS ({interval}) is outside "
                                f"[LEASES_POD_INTERVAL_MIN, LEASES_POD_INTERVAL_MAX] = [{low}, {high}]",
                                id="leases.E005"))
    factor = _int("POD_EXPIRY_FACTOR", errors)
    if factor is not None and factor < 2:
        errors.append(Error(f"LEASES_POD_EXPIRY_FACTOR must be at least 2 (one missed heartbeat must not kill a "
                            f"pod), got {factor}", id="leases.E006"))
    liveness = _int("INVALIDATION_LIVENESS_MS", errors)
    if liveness is not None and not 100 <= liveness <= 2000:
        # Longer would let a frozen Redis keep stale caps in force for longer.
        errors.append(Error(f"LEASES_INVALIDATION_LIVENESS_MS must be between 100 and 2000, got {liveness}",
                            id="leases.E007"))
    poll = _int("TICKET_POLL_SECONDS", errors)
    if poll is not None and not 1 <= poll <= 60:
        errors.append(Error(f"LEASES_TICKET_POLL_SECONDS must be between 1 and 60, got {poll}", id="leases.E007"))
    hours = _int("HISTORY_HOURS", errors)
    if hours is not None and hours < 1:
        errors.append(Error(f"LEASES_HISTORY_HOURS must be at least 1, got {hours}", id="leases.E007"))
    timeout = _int("MONGO_TIMEOUT_MS", errors)
    if timeout is not None and timeout <= 0:
        errors.append(Error(f"LEASES_MONGO_TIMEOUT_MS must be positive, got {timeout}", id="leases.E007"))
    claim, mark = _int("GRANT_CLAIM_MS", errors), _int("GRANT_MARK_DELAY_MS", errors)
    if claim is not None and claim <= 0:
        errors.append(Error(f"LEASES_GRANT_CLAIM_MS must be positive, got {claim}", id="leases.E007"))
    elif claim is not None and mark is not None and not 0 <= mark * 2 <= claim:
        # Later, a process that pauses a moment would lose every lease it was handed.
        errors.append(Error(f"LEASES_GRANT_MARK_DELAY_MS must be between 0 and half of LEASES_GRANT_CLAIM_MS "
                            f"({claim // 2}), got {mark}", id="leases.E007"))
    return errors


@register(TAG)
def check_database_alias(app_configs: Any = None, **kwargs: Any) -> list:
    """``LEASES_DATABASE`` names a django-mongodb-backend alias, routed when it is not ``default``."""
    alias = lease_settings.DATABASE
    databases = settings.DATABASES
    if alias not in databases:
        return [Error(f"LEASES_DATABASE {alias!r} is not in DATABASES ({', '.join(sorted(databases))})",
                      id="leases.E008")]
    engine = databases[alias].get("ENGINE", "")
    if engine != "django_mongodb_backend":
        return [Error(f"LEASES_DATABASE {alias!r} uses {engine!r}; the lease apps' models need "
                      "django_mongodb_backend",
                      hint="Add a MongoDB alias ({'ENGINE': 'django_mongodb_backend', 'HOST': MONGODB_URI, 'NAME': ...}) and "
                           "point LEASES_DATABASE at it.", id="leases.E008")]
    if alias != "default":
        routers = [r if isinstance(r, str) else f"{type(r).__module__}.{type(r).__qualname__}"
                   for r in settings.DATABASE_ROUTERS]
        if "leases.routers.LeasesRouter" not in routers:
            return [Error(f"LEASES_DATABASE is {alias!r} but DATABASE_ROUTERS lacks leases.routers.LeasesRouter: "
                          "the lease apps' models would land on the default database",
                          id="leases.E009")]
    return []


@register(TAG)
def check_tenant_access(app_configs: Any = None, **kwargs: Any) -> list:
    """``LEASES_TENANT_ACCESS`` imports and is a ``TenantAccess``."""
    from django.core.exceptions import ImproperlyConfigured

    from leases.tenancy import tenant_access

    try:
        tenant_access()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="leases.E011")]
    return []


@register(TAG)
def check_pod_addresses(app_configs: Any = None, **kwargs: Any) -> list:
    """``LEASES_POD_ENDPOINT`` (when set) is an http(s) URL; ``LEASES_WORKER_INTERNAL_BIND`` is host:port.

    Other pods deliver revocations to the endpoint; a malformed one would fail only when a
    revocation is due, so it is caught here.
    """
    errors = []
    endpoint = lease_settings.POD_ENDPOINT
    if endpoint:
        parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
        try:
            port_ok = parts is not None and (parts.port is None or parts.port > 0)
        except ValueError:
            port_ok = False
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
            errors.append(Error(f"LEASES_POD_ENDPOINT {endpoint!r} is not an http(s) URL with a host",
                                hint="e.g. http://10.0.3.7:8000 (how other pods reach this one)", id="leases.E012"))
    bind = lease_settings.WORKER_INTERNAL_BIND
    port = bind.rpartition(":")[2] if isinstance(bind, str) and ":" in bind else ""
    if not port.isdigit() or int(port) > 65535:
        errors.append(Error(f"LEASES_WORKER_INTERNAL_BIND {bind!r} is not host:port (port 0 = any free port)",
                            id="leases.E012"))
    return errors


SWEEP_TASK = "leases.tasks.sweep"


@register(TAG)
def check_sweep_scheduled(app_configs: Any = None, **kwargs: Any) -> list:
    """A ``CELERY_BEAT_SCHEDULE`` entry runs ``leases.tasks.sweep``.

    Only the sweep reaps the leases of a pod that died and reconciles counters, and an
    expired holder is otherwise reaped only when someone acquires its resource: without the
    entry, slots leak quietly to the dead. Only the settings are judged (a schedule built in
    code on the Celery app, or a cron running ``manage.py lease sweep``, is invisible here:
    silence the warning then).
    """
    schedule = getattr(settings, "CELERY_BEAT_SCHEDULE", None)
    entries = schedule.values() if isinstance(schedule, dict) else ()
    if any(isinstance(entry, dict) and entry.get("task") == SWEEP_TASK for entry in entries):
        return []
    return [Warning(f"No CELERY_BEAT_SCHEDULE entry runs task {SWEEP_TASK!r}: idle and dead-pod reaps and "
                    "reconcile never run",
                    hint='Add CELERY_BEAT_SCHEDULE = {"lease-sweep": {"task": "leases.tasks.sweep", "schedule": '
                         'float(LEASES_REAP_INTERVAL), "options": {"expires": LEASES_REAP_INTERVAL * 0.9}}} and run '
                         'one "celery -A <project> beat"; if the sweep is scheduled elsewhere, add "leases.W006" '
                         "to SILENCED_SYSTEM_CHECKS.", id="leases.W006")]


@register(TAG)
def check_metrics_directory(app_configs: Any = None, **kwargs: Any) -> list:
    """``PROMETHEUS_MULTIPROC_DIR`` (when set) is a directory this process can write.

    prometheus_client opens its files there on a metric's first use: a missing directory
    would surface as an error inside an acquisition, after its slots were booked.
    """
    import os

    from leases.telemetry.multiprocess import ENV, directory

    path = directory()
    if path is None or (os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)):
        return []
    return [Error(f"{ENV} is {path!r}, which is not a writable directory: this process could not record metrics",
                  hint="Create (and empty) it in the start-up script before any process starts, the same path for "
                       "every process of this host; or unset it for one registry per process.", id="leases.E013")]


UNDEFINED_LEASE_MODES = ("noop", "error")


@register(TAG)
def check_undefined_lease(app_configs: Any = None, **kwargs: Any) -> list:
    """``LEASES_UNDEFINED_LEASE`` is ``"noop"`` or ``"error"`` (any other value acts as
    ``"error"`` at run time: fail closed, but say so here)."""
    value = lease_settings.UNDEFINED_LEASE
    if value in UNDEFINED_LEASE_MODES:
        return []
    return [Error(f"LEASES_UNDEFINED_LEASE must be one of {list(UNDEFINED_LEASE_MODES)}, got {value!r}",
                  hint='"noop": an undefined lease name acquires NOOP (unlimited); "error": it raises '
                       "UnknownLease. Until fixed, undefined names raise.", id="leases.E020")]


@register(TAG)
def check_metrics_namespace(app_configs: Any = None, **kwargs: Any) -> list:
    """``LEASES_METRICS_NAMESPACE`` can start a Prometheus metric name (it prefixes every
    series); with a bad value the process records its metrics under the default namespace,
    which no dashboard of the host's own name would find."""
    from leases.errors import InvalidSetting
    from leases.telemetry.metrics import DEFAULT_NAMESPACE, configured_namespace

    try:
        configured_namespace()
    except InvalidSetting as exc:
        return [Error(str(exc), hint=f"e.g. \"my_app\"; until fixed, the series are named {DEFAULT_NAMESPACE}_lease_….",
                      id="leases.E014")]
    return []
