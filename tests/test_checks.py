"""leases.checks: production mistakes fail (or warn in) ``manage.py check``."""

from __future__ import annotations

import io

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from leases.conf import INSECURE_INTERNAL_SECRET

LONG_SECRET = "x" * 48


def ids(*, deploy: bool = False) -> set[str]:
    return {m.id for m in run_checks(tags=["leases"], include_deployment_checks=deploy)}


def test_given_the_test_settings_when_checked_then_no_lease_error():
    with override_settings(LEASES_INTERNAL_SECRET=LONG_SECRET):
        assert ids() == set()
        out = io.StringIO()
        call_command("check", stdout=out)
        assert "no issues" in out.getvalue()


def test_given_the_default_internal_secret_with_debug_off_when_checked_then_check_fails_with_e001():
    with override_settings(DEBUG=False, LEASES_INTERNAL_SECRET=INSECURE_INTERNAL_SECRET), pytest.raises(SystemCheckError, match="leases.E001"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())


def test_given_the_default_internal_secret_with_debug_on_when_checked_then_it_passes():
    with override_settings(DEBUG=True, LEASES_INTERNAL_SECRET=INSECURE_INTERNAL_SECRET):
        assert "leases.E001" not in ids()


def test_given_a_short_or_empty_secret_then_a_warning_or_an_error():
    with override_settings(LEASES_INTERNAL_SECRET="short"):
        assert "leases.W001" in ids()
    with override_settings(LEASES_INTERNAL_SECRET="", DEBUG=True):
        assert "leases.E001" in ids()


@pytest.mark.parametrize("uri, expected", [
    ("", "leases.E002"),
    ("   ", "leases.E002"),
    ("postgres://127.0.0.1/x", "leases.E003"),
    ("mongodb://127.0.0.1:notaport/", "leases.E003"),
])
def test_given_a_missing_or_unparsable_mongodb_uri_when_checked_then_it_fails(uri, expected):
    with override_settings(MONGODB_URI=uri, LEASES_INTERNAL_SECRET=LONG_SECRET), pytest.raises(SystemCheckError, match=expected):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379/1", "redis://127.0.0.1:port/1", "", 6379])
def test_given_an_unparsable_redis_url_when_checked_then_e004(url):
    with override_settings(LEASES_REDIS_URL=url):
        assert "leases.E004" in ids()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/1", "rediss://cache.internal:6380/0", "unix:///run/redis.sock"])
def test_given_a_good_redis_url_when_checked_then_no_e004(url):
    with override_settings(LEASES_REDIS_URL=url):
        assert "leases.E004" not in ids()


@pytest.mark.parametrize("overrides", [
    {"LEASES_POD_INTERVAL_MIN": 30, "LEASES_POD_INTERVAL_MAX": 10},
    {"LEASES_POD_INTERVAL_MIN": 0},
    {"LEASES_POD_INTERVAL_SECONDS": 120},
    {"LEASES_POD_INTERVAL_MAX": "60"},
])
def test_given_pod_interval_bounds_that_contradict_when_checked_then_it_fails(overrides):
    with override_settings(LEASES_INTERNAL_SECRET=LONG_SECRET, **overrides), pytest.raises(SystemCheckError, match=r"leases\.E00[5]|leases\.E010"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.parametrize("overrides, expected", [
    ({"LEASES_POD_EXPIRY_FACTOR": 1}, "leases.E006"),
    ({"LEASES_INVALIDATION_LIVENESS_MS": 5000}, "leases.E007"),
    ({"LEASES_TICKET_POLL_SECONDS": 0}, "leases.E007"),
    ({"LEASES_HISTORY_HOURS": 0}, "leases.E007"),
    ({"LEASES_MONGO_TIMEOUT_MS": -1}, "leases.E007"),
    ({"LEASES_GRANT_MARK_DELAY_MS": 300}, "leases.E007"),  # past half the 500 ms claim window
    ({"LEASES_GRANT_MARK_DELAY_MS": -1}, "leases.E007"),
    ({"LEASES_GRANT_CLAIM_MS": 0}, "leases.E007"),
])
def test_given_other_out_of_range_settings_when_checked_then_each_has_its_error(overrides, expected):
    with override_settings(**overrides):
        assert expected in ids()


@pytest.mark.parametrize("query, expected", [
    ("w=1", "leases.W002"),
    ("readPreference=secondaryPreferred", "leases.W003"),
    ("retryWrites=false", "leases.W004"),
    ("retryReads=false", "leases.W004"),
])
def test_given_a_uri_asking_less_than_the_engine_needs_then_a_warning_names_it(query, expected):
    with override_settings(MONGODB_URI=f"mongodb://db1:27017,db2:27017/?replicaSet=rs0&{query}"):
        assert expected in ids()


def test_given_a_replica_set_uri_with_what_the_engine_needs_then_no_warning_even_with_deploy():
    uri = "mongodb://db1:27017,db2:27017,db3:27017/?replicaSet=rs0&w=majority&readPreference=primary&retryWrites=true"
    with override_settings(MONGODB_URI=uri, LEASES_INTERNAL_SECRET=LONG_SECRET):
        assert ids(deploy=True) == set()


def test_given_a_direct_connection_uri_then_only_the_deploy_check_warns():
    with override_settings(MONGODB_URI="mongodb://127.0.0.1:27017/?directConnection=true",
                           LEASES_INTERNAL_SECRET=LONG_SECRET):
        assert "leases.W005" not in ids()
        assert "leases.W005" in ids(deploy=True)


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_given_a_lease_database_alias_that_is_missing_not_mongodb_or_unrouted_then_e008_or_e009():
    with override_settings(LEASES_DATABASE="nosuch"):
        assert "leases.E008" in ids()
    postgres = {"ENGINE": "django.db.backends.postgresql", "NAME": "test"}
    with override_settings(DATABASES={**settings.DATABASES, "pg": postgres}, LEASES_DATABASE="pg"):
        assert "leases.E008" in ids()
    with override_settings(DATABASES={**settings.DATABASES, "leases": settings.DATABASES["default"]},
                           LEASES_DATABASE="leases"):
        assert "leases.E009" in ids()
        with override_settings(DATABASE_ROUTERS=["leases.routers.LeasesRouter"]):
            assert {"leases.E008", "leases.E009"} & ids() == set()


def test_given_a_tenant_access_path_that_does_not_import_then_e011():
    with override_settings(LEASES_TENANT_ACCESS="nowhere.Access"):
        assert "leases.E011" in ids()


@pytest.mark.parametrize("overrides", [
    {"LEASES_POD_ENDPOINT": "10.0.3.7:8000"},
    {"LEASES_POD_ENDPOINT": "ftp://10.0.3.7/"},
    {"LEASES_POD_ENDPOINT": "http://10.0.3.7:notaport"},
    {"LEASES_WORKER_INTERNAL_BIND": "127.0.0.1"},
    {"LEASES_WORKER_INTERNAL_BIND": "127.0.0.1:99999"},
])
def test_given_a_malformed_pod_endpoint_or_worker_bind_then_e012(overrides):
    with override_settings(**overrides):
        assert "leases.E012" in ids()


@pytest.mark.parametrize("overrides", [
    {"LEASES_POD_ENDPOINT": "http://10.0.3.7:8000"},
    {"LEASES_POD_ENDPOINT": "https://pod-3.internal"},
    {"LEASES_WORKER_INTERNAL_BIND": "0.0.0.0:9100"},
])
def test_given_a_good_pod_endpoint_or_worker_bind_then_no_e012(overrides):
    with override_settings(**overrides):
        assert "leases.E012" not in ids()


SWEEP_ENTRY = {"task": "leases.tasks.sweep", "schedule": 30.0, "options": {"expires": 27.0}}


def test_given_the_example_settings_then_a_beat_entry_runs_the_sweep_and_no_w006():
    assert any(e.get("task") == "leases.tasks.sweep" for e in settings.CELERY_BEAT_SCHEDULE.values())
    assert "leases.W006" not in ids()
    with override_settings(CELERY_BEAT_SCHEDULE={"other": {"task": "x.y"}, "renamed-sweep": SWEEP_ENTRY}):
        assert "leases.W006" not in ids()


@pytest.mark.parametrize("schedule", [{}, {"other": {"task": "hostsite.tasks.nightly", "schedule": 60.0}},
                                      {"lease-sweep": {"task": "leases.tasks.swept", "schedule": 30.0}}, None])
def test_given_no_beat_entry_running_the_sweep_then_w006_names_what_never_runs(schedule):
    with override_settings(CELERY_BEAT_SCHEDULE=schedule):
        messages = [m for m in run_checks(tags=["leases"]) if m.id == "leases.W006"]
    assert len(messages) == 1
    assert "idle and dead-pod reaps and reconcile never run" in messages[0].msg


def test_given_no_celery_beat_schedule_setting_at_all_then_w006():
    with override_settings():
        del settings.CELERY_BEAT_SCHEDULE
        assert "leases.W006" in ids()


def test_given_a_metrics_directory_that_does_not_exist_when_checked_then_e013(monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    assert "leases.E013" in ids()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert "leases.E013" not in ids()
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    assert "leases.E013" not in ids()


@pytest.mark.parametrize("namespace", ["my-app", "9lives", "", 7])
def test_given_a_metrics_namespace_that_cannot_name_a_series_when_checked_then_e014(namespace):
    with override_settings(LEASES_METRICS_NAMESPACE=namespace):
        assert "leases.E014" in ids()
    with override_settings(LEASES_METRICS_NAMESPACE="my_app"):
        assert "leases.E014" not in ids()


def test_given_a_bad_metrics_namespace_at_start_up_then_check_names_it_instead_of_a_traceback():
    import subprocess

    from tests.helpers import PYTHON, REPO, child_env

    done = subprocess.run([PYTHON, "manage.py", "check"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=child_env(LEASES_METRICS_NAMESPACE="my-app", DJANGO_DEBUG="1"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "leases.E014" in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
