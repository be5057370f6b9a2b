"""Adoption: a fresh clone, the wheel installed into a new virtualenv, a new PostgreSQL-backed project.

These are the tutorial's steps (docs/tutorial.md, the site's "From a fresh Django project to a
first lease"), run as typed under
``bash -euo pipefail``: a venv made with the interpreter a newcomer has, the wheel built from
the checkout by that venv's pip and installed with its ``embedded`` extra, ``django-admin
startproject`` with PostgreSQL as the host's own default database, the lease settings appended
beside the host's (``examples/hostsite/settings_block.py``), the example project's tenancy hook,
views, URLs, tasks and Celery app copied in (``examples/hostsite/``), ``migrate`` both aliases,
then real HTTP requests to the project served by uvicorn (ASGI): acquire/check/release from a
view and from an async view, a ``@leased`` Celery task run by a real prefork worker of the
project, the tutorial's Insights step (users of the host's tenant model, then curl as the tenant
admin, a stranger and anonymous; the shipped login page), a busy resource answered 429 with
``Retry-After``, the project's Celery beat sending the sweep that reaps an expired holder, and
the tutorial's ``/metrics`` scrape (one ``PROMETHEUS_MULTIPROC_DIR`` for worker, beat and uvicorn)
showing the ``@leased`` task's grant, counted in a worker pool child, and the sweep's reap.
Before ``migrate``, ``manage.py check`` without ``MONGODB_URI`` must reach the app's own check
(``leases.E002``), not fail in the settings.

It runs once per supported Django series: 5.2 LTS on this interpreter (3.11) and 6.1 on Python
3.12 (``LEASES_PY312``, else ``python3.12`` on the PATH, else pyenv's 3.12.1); the venv's pip picks
the series the interpreter allows, and the test checks it got the one it names.

The tutorial's commands are constants here, run as written (``/tmp/host`` becomes this run's
directory, port 8002 a free one, ``python3`` the series' interpreter, ``$REPO`` a clean copy of
the checkout); the last test fails when the tutorial's copy drifts. The tutorial's embedded-server
line is not run (the test run's server stands in for it), but the binary it names must be in the
venv.

The host's PostgreSQL tables go into a schema of this run (``PGOPTIONS`` search_path), so
runs do not see each other's users; the lease alias is a database of the test run's
embedded server.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pymongo
import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from leases.store.embedded import free_port

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "hostsite"
LEASE_DB = "hostsite_leases"
STEP_TIMEOUT = 300
# Beat's sweep interval in this run, so a sweep comes within seconds (the project's default is 30).
REAP_INTERVAL = 2

# The tutorial's commands (docs/tutorial.md), as typed there; _host() maps them onto this run.
INSTALL = """\
python3 -m venv /tmp/host/venv
/tmp/host/venv/bin/python -m pip wheel --no-deps -q -w /tmp/host/wheels "$REPO"
/tmp/host/venv/bin/python -m pip install -q "/tmp/host/wheels/django_leases-0.1.0-py3-none-any.whl[embedded]" "psycopg[binary]" uvicorn
"""
EMBEDDED_SERVER = ("/tmp/host/venv/bin/secantusd-py --port 27018 --storage-path :memory: --standalone"
                   " > /tmp/host/secantusd.log 2>&1 &")
HOST_FILES = ("tenancy", "views", "urls", "tasks", "celery")
SITE = """\
mkdir -p /tmp/host/site && cd /tmp/host/site
/tmp/host/venv/bin/django-admin startproject hostsite .
# Your project has its own default database already; this new one's is made PostgreSQL:
echo 'DATABASES["default"] = {"ENGINE": "django.db.backends.postgresql", "NAME": "test", "USER": "postgres", "HOST": "127.0.0.1"}' >> hostsite/settings.py
cat "$REPO/examples/hostsite/settings_block.py" >> hostsite/settings.py
cp "$REPO"/examples/hostsite/{""" + ",".join(HOST_FILES) + """}.py hostsite/
echo "from .celery import app as celery_app" >> hostsite/__init__.py
"""
MIGRATE = """\
/tmp/host/venv/bin/python manage.py check
/tmp/host/venv/bin/python manage.py migrate                      # the host's apps, on PostgreSQL
/tmp/host/venv/bin/python manage.py migrate --database leases    # the lease apps, on MongoDB
"""
# One empty multiprocess directory for the processes started after it (prometheus_client's
# multiprocess mode, leases/telemetry/multiprocess.py): each writes its counts there, /metrics adds them up.
METRICS_DIR = ('export PROMETHEUS_MULTIPROC_DIR=/tmp/host/prometheus && rm -rf "$PROMETHEUS_MULTIPROC_DIR"'
               ' && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"   # worker, beat and uvicorn: their metrics, one scrape')
WORKER = "/tmp/host/venv/bin/celery -A hostsite worker --pool prefork --concurrency 2 --loglevel WARNING"
BEAT = "/tmp/host/venv/bin/celery -A hostsite beat --loglevel INFO"
UVICORN = "/tmp/host/venv/bin/uvicorn hostsite.asgi:application --host 127.0.0.1 --port 8002"
INSIGHTS_STEP = """\
/tmp/host/venv/bin/python manage.py shell -c "
from django.contrib.auth.models import Group, User
from django.test import Client
acme = Group.objects.create(name='acme')  # hostsite/tenancy.py: a tenant is an auth group
ada = User.objects.create_user('ada', is_staff=True); ada.groups.add(acme)  # staff of acme: its admin
sam = User.objects.create_user('sam', is_staff=True)  # staff, but of no tenant
for user in (ada, sam):
    client = Client(); client.force_login(user); print(user.username, client.cookies['sessionid'].value)
" > /tmp/host/sessions
ADA=$(awk '$1 == "ada" {print $2}' /tmp/host/sessions); SAM=$(awk '$1 == "sam" {print $2}' /tmp/host/sessions)
curl -s -w '\\n' http://127.0.0.1:8002/hold/    # {"token": "…"}: a lease kept, for Insights to show
curl -s -b "sessionid=$ADA" http://127.0.0.1:8002/t/acme/insights/leases | grep -o 'data-token="[^"]*"'  # that token
curl -s -o /dev/null -w '%{http_code}\\n' -b "sessionid=$ADA" http://127.0.0.1:8002/t/acme/insights/api-keys  # 200
curl -s -o /dev/null -w '%{http_code}\\n' -b "sessionid=$SAM" http://127.0.0.1:8002/t/acme/insights/leases  # 404
curl -s -o /dev/null -w '%{http_code} %{redirect_url}\\n' http://127.0.0.1:8002/t/acme/insights/leases  # 302 to the login page
curl -s http://127.0.0.1:8002/accounts/login/ | grep -o '<title>[^<]*</title>'  # <title>Sign in · Vance</title>
"""
BUSY_STEP = ("curl -s -o /dev/null -w '%{http_code} Retry-After: %header{retry-after}\\n' http://127.0.0.1:8002/hold/"
             "  # 429: acme/reports holds its one tex slot")
SCRAPE_STEP = """\
# One scrape, every process: the views' grants (uvicorn), the @leased task's (a worker pool child)
# and the reap of beat's sweep (run by the worker) once /hold/'s lease outlived its 120 s TTL:
curl -s http://127.0.0.1:8002/metrics | grep -E '^vance_lease_(acquire|reap)_total'
# vance_lease_acquire_total{outcome="success",resource="tex2pdf"} 4.0   <- 3 from the views, 1 from the task
# vance_lease_acquire_total{outcome="busy",resource="tex2pdf"} 1.0
# vance_lease_reap_total{reason="idle"} 1.0
"""
# Copied into the build directory: what a fresh clone holds (no venv, no build output, no git).
_IGNORE = shutil.ignore_patterns(".git", ".venv", "var", "build", "site", "*.egg-info", "__pycache__", "node_modules",
                                 "staticfiles")


@functools.cache
def _python312() -> str | None:
    """An interpreter for the Django 6.1 run (6.x needs Python 3.12+), or None where there is none.

    Each candidate is asked for its version: a pyenv shim on the PATH exists but may not run.
    """
    for candidate in (os.environ.get("LEASES_PY312"), "/root/.pyenv/versions/3.12.1/bin/python3",
                      shutil.which("python3.12")):
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        probe = subprocess.run([candidate, "-c", "import sys, venv; sys.exit(sys.version_info < (3, 12))"],
                               capture_output=True, timeout=60, check=False)
        if probe.returncode == 0:
            return candidate
    return None


# (series, interpreter): the venv's pip picks the newest Django the interpreter allows.
SERIES = [
    pytest.param("5.2", getattr(sys, "_base_executable", sys.executable), id="django52"),
    pytest.param("6.1", _python312(), id="django61",
                 marks=pytest.mark.skipif(_python312() is None, reason=(
                     "Django 6.1 needs Python 3.12+: set LEASES_PY312 or put python3.12 on the PATH"))),
]


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float = STEP_TIMEOUT,
         with_stderr: bool = False) -> str:
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"$ {' '.join(str(c) for c in cmd)}  ({time.monotonic() - started:.1f} s)")
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout + done.stderr if with_stderr else done.stdout


def _host(command: str, tmp: Path, port: int = 8002, python: str = "python3") -> str:
    """A tutorial command as this run types it: its directory for /tmp/host, a free port for 8002,
    the series' interpreter for the venv's ``python3``."""
    return (command.replace("/tmp/host/", f"{tmp}/").replace("8002", str(port))
            .replace("python3 -m venv", f"{python} -m venv"))


def _bash(script: str, *, cwd: Path, env: dict[str, str], timeout: float = STEP_TIMEOUT) -> str:
    """Tutorial lines as typed, under ``bash -euo pipefail`` (a failing command or grep fails the step)."""
    return _run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, timeout=timeout)


def _scrape(tmp: Path, port: int, *, cwd: Path, env: dict[str, str]) -> dict[tuple[str, tuple], float]:
    """The tutorial's scrape line, as typed: every sample it greps, by (name, sorted labels)."""
    text = _bash(_host(SCRAPE_STEP, tmp, port), cwd=cwd, env=env)
    print(text.strip())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _host_env(schema: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env.update({
        "MONGODB_URI": settings.MONGODB_URI,
        # libpq reads PGOPTIONS: the host's tables land in this run's schema.
        "PGOPTIONS": f"-c search_path={schema}",
        "LEASES_INTERNAL_SECRET": secrets.token_urlsafe(48),
        # A Redis database of its own for the project's Celery broker and results.
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/13",
        "CELERY_RESULT_BACKEND": "redis://127.0.0.1:6379/13",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    })
    return env


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect is an answer to look at, not to follow


_opener = urllib.request.build_opener(_NoRedirect)


def _get(url: str, *, cookie: str | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers={"Cookie": f"sessionid={cookie}"} if cookie else {})
    try:
        with _opener.open(request, timeout=30) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def _wait_http(url: str, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"runserver exited with {process.returncode}"
        try:
            _opener.open(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"runserver did not answer {url} within {timeout:.0f} s")


class _Install:
    """One series' tutorial install lines, started in the background."""

    def __init__(self, tmp: Path, interpreter: str) -> None:
        self.tmp = tmp
        self.source = tmp / "src"
        shutil.copytree(REPO, self.source, ignore=_IGNORE)  # what a fresh clone holds
        self.script = _host(INSTALL, tmp, python=interpreter)
        self.started = time.monotonic()
        env = {**_host_env("public"), "REPO": str(self.source)}  # the tutorial's REPO=$PWD, typed in the clone
        # Output to files, not pipes: the lines run for minutes before anyone reads them, and a
        # full pipe would stop pip.
        self.out, self.err = tmp / "install.out", tmp / "install.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", self.script], cwd=tmp, env=env,
                                            stdout=out, stderr=err)

    def wait(self) -> None:
        """Wait for the lines to finish (at most STEP_TIMEOUT from now) and fail the step as ``_bash`` would."""
        self.process.wait(timeout=STEP_TIMEOUT)
        out, err = self.out.read_text(errors="replace"), self.err.read_text(errors="replace")
        print(f"$ bash -euo pipefail -c {self.script}  ({time.monotonic() - self.started:.1f} s since it started, "
              "both series at once)")
        assert self.process.returncode == 0, f"install failed ({self.process.returncode}):\n{out[-3000:]}\n{err[-5000:]}"


#: The installs started so far, by series: tests/conftest.py starts them when the session's
#: first test sets up, so that pip (most of each series' run: ~2 min of the suite's wall time
#: when it ran in this module's turn) overlaps the rest of the suite, which mostly waits on
#: sleeps, windows and other processes and leaves the two cores room for it.
_STARTED: dict[str, _Install] = {}


def selected_series(items) -> set[str]:
    """The series whose adoption test is among the session's selected ``items``."""
    return {item.callspec.params["series"] for item in items
            if getattr(item, "module", None) is sys.modules[__name__] and hasattr(item, "callspec")}


def start_installs(tmp_path_factory, series: set[str]) -> dict[str, _Install]:
    """Start the install lines of ``series`` (those with an interpreter) that have not started
    yet; every install started so far, by series."""
    for param in SERIES:
        name, interpreter = param.values
        if interpreter is not None and name not in _STARTED and name in series:
            _STARTED[name] = _Install(tmp_path_factory.mktemp(f"adoption-{param.id}"), interpreter)
    return _STARTED


def stop_installs() -> None:
    """Kill the install lines still running (a session that ends before this module's turn)."""
    for install in _STARTED.values():
        if install.process.poll() is None:
            install.process.kill()
            install.process.wait()


@pytest.fixture(scope="module")
def installs(request, tmp_path_factory):
    """Every selected series' install lines at once: pip takes most of each run, and two series
    overlap on two cores in little more than one's time (each in a directory, venv and clone of
    its own). Usually started long before (see ``_STARTED``)."""
    yield start_installs(tmp_path_factory, selected_series(request.session.items))
    stop_installs()


@pytest.fixture
def workdir(installs, series):
    tmp = installs[series].tmp
    schema = f"adoption_{secrets.token_hex(4)}"
    mongo = pymongo.MongoClient(settings.MONGODB_URI)
    mongo.drop_database(LEASE_DB)
    yield tmp, schema, mongo
    mongo.drop_database(LEASE_DB)
    mongo.close()
    psql_python = tmp / "venv" / "bin" / "python"
    if psql_python.exists():
        subprocess.run([str(psql_python), "-c", (
            "import psycopg; psycopg.connect('host=127.0.0.1 port=5432 dbname=test user=postgres', autocommit=True)"
            f".execute('DROP SCHEMA IF EXISTS {schema} CASCADE')")], timeout=60, check=False)


# The tutorial's scrape: the grants of tex2pdf (views in uvicorn, the @leased task in a worker pool child).
GRANTED = ("vance_lease_acquire_total", (("outcome", "success"), ("resource", "tex2pdf")))


def _then_the_wheel_ships_both_packages_their_data_and_metadata(wheel: Path, source: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = sorted({n.split("/", 1)[0] for n in names if ".dist-info/" not in n})
    print("wheel top-level names:", top_level)
    assert top_level == ["insights", "leases"]
    for shipped in ("insights/templates/insights/login.html", "leases/api/templates/leases_api/keys.html",
                    "leases/defaults/_vance/config/lease/tex.yaml", "leases/routers.py", "leases/checks.py"):
        assert shipped in names
    # Every template and YAML default of the source tree: package-data's globs miss none.
    data = {str(f.relative_to(source)) for f in source.glob("*/**/*")
            if f.is_file() and f.suffix in {".html", ".yaml"} and f.parts[len(source.parts)] in top_level}
    assert data and data <= set(names), sorted(data - set(names))
    # A package's metadata: the README as long description, licence, classifiers, project URLs,
    # the Django series both runs install.
    (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    metadata = zipfile.ZipFile(wheel).read(metadata_name).decode()
    for field in ("License-Expression: ", "Classifier: Framework :: Django :: 5.2",
                  "Classifier: Framework :: Django :: 6.1", "Project-URL: Changelog, ",
                  "Description-Content-Type: text/markdown", "Requires-Dist: django!=6.0.*,<6.2,>=5.2"):
        assert field in metadata, field
    assert "# django-leases" in metadata  # the long description is the README
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names


def _then_the_venv_runs_the_installed_wheel_on_the_series(tmp: Path, env: dict[str, str], series: str,
                                                           interpreter: str) -> str:
    """The venv's python (asserted to import the wheel's ``leases`` under the series' Django)."""
    venv = tmp / "venv"
    python = str(venv / "bin" / "python")
    located = _run([python, "-c", "import django, leases; print(leases.__file__); print(django.get_version())"],
                   cwd=tmp, env=env).split()
    assert str(venv) in located[0]  # the installed wheel, not this checkout
    print(f"Django {located[1]} on {interpreter}")
    assert located[1].startswith(series + "."), f"Django {located[1]} installed for the {series} run"
    # The tutorial starts the embedded server from the installed package (the test's server stands in).
    assert os.access(_host(EMBEDDED_SERVER, tmp).split()[0], os.X_OK)
    return python


def _when_a_new_postgresql_project_adopts_the_apps(tmp: Path, schema: str, env: dict[str, str],
                                                   python: str) -> Path:
    """The tutorial's site and migrate steps; the project's directory."""
    _run([python, "-c", (
        "import psycopg; psycopg.connect('host=127.0.0.1 port=5432 dbname=test user=postgres', autocommit=True)"
        f".execute('CREATE SCHEMA {schema}')")], cwd=tmp, env=env)
    _bash(_host(SITE, tmp), cwd=tmp, env=env)
    site = tmp / "site"
    # No MONGODB_URI yet: the app's own check says so; the settings do not fail first.
    unset = {k: v for k, v in env.items() if k != "MONGODB_URI"}
    done = subprocess.run([python, "manage.py", "check"], cwd=site, env=unset, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT)
    print("check without MONGODB_URI:", done.returncode, (done.stdout + done.stderr).strip()[-600:])
    assert done.returncode == 1 and "leases.E002" in done.stderr and "Traceback" not in done.stderr, done.stderr
    checked = _bash(_host(MIGRATE, tmp).splitlines()[0] + " 2>&1", cwd=site, env=env)
    print(checked.strip())
    assert "leases.W006" not in checked  # the settings block's beat entry schedules the sweep
    _bash(_host(MIGRATE, tmp), cwd=site, env=env)
    return site


def _then_the_router_kept_each_side_to_its_own(python: str, site: Path, schema: str, env: dict[str, str],
                                               mongo: pymongo.MongoClient) -> None:
    """Users in PostgreSQL, the lease apps in MongoDB."""
    tables = _run([python, "-c", (
        "import psycopg; c = psycopg.connect('host=127.0.0.1 port=5432 dbname=test user=postgres');"
        f"print(sorted(r[0] for r in c.execute(\"select table_name from information_schema.tables "
        f"where table_schema = '{schema}'\")))")], cwd=site, env=env)
    assert "auth_user" in tables and "django_session" in tables
    assert "api_keys" not in tables and "insights_tenant" not in tables
    collections = set(mongo[LEASE_DB].list_collection_names())
    assert {"api_keys", "lease_config_documents", "insights_tenant"} <= collections, collections
    assert not {"auth_user", "django_session"} & collections


def _when_uvicorn_a_worker_and_beat_start(tmp: Path, site: Path, env: dict[str, str],
                                          port: int) -> tuple[dict[str, str], dict[str, subprocess.Popen]]:
    """The project under uvicorn, a Celery worker and beat of the project, all started with the
    tutorial's multiprocess directory (its line exports it to them); (their env, the processes)."""
    metrics_dir = Path(_bash(_host(METRICS_DIR, tmp) + '\nprintf %s "$PROMETHEUS_MULTIPROC_DIR"', cwd=site, env=env))
    assert metrics_dir.is_dir() and not any(metrics_dir.iterdir()) and metrics_dir.is_relative_to(tmp), metrics_dir
    env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    processes = {name: subprocess.Popen(shlex.split(_host(command, tmp, port)), cwd=site,
                                        env={**env, "LEASES_REAP_INTERVAL": str(REAP_INTERVAL)} if name == "beat" else env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for name, command in (("uvicorn", UVICORN), ("worker", WORKER), ("beat", BEAT))}
    return env, processes


def _stopped(processes: dict[str, subprocess.Popen]) -> dict[str, str]:
    """Terminate each process (kill after 20 s); their logs by name."""
    logs: dict[str, str] = {}
    for name, process in processes.items():
        process.terminate()
        try:
            logs[name], _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            logs[name], _ = process.communicate()
        print(f"{name} log tail:\n" + logs[name][-1500:])
    return logs


def _then_the_views_and_the_leased_task_are_granted_and_scraped(python: str, tmp: Path, site: Path, port: int,
                                                                env: dict[str, str], holders) -> None:
    base = f"http://127.0.0.1:{port}"
    for view in ("/compile/", "/acompile/"):
        status, body, _ = _get(base + view)
        assert status == 200, body
        compiled = json.loads(body)
        assert compiled["released"] is True and len(compiled["token"]) == 32
        assert holders.find_one({"_id": compiled["token"]}) is None  # released

    # The tutorial's scrape, before and after the @leased task: uvicorn serves /metrics and
    # acquires nothing in between, so the grant added comes from the worker's pool child.
    assert _scrape(tmp, port, cwd=site, env=env).get(GRANTED) == 2  # /compile/ and /acompile/

    result = json.loads(_run([python, "manage.py", "shell", "-c", (
        "import json; from hostsite.tasks import compile_pdf\n"
        "print(json.dumps(compile_pdf.delay('acme', 'docs', 'carol').get(timeout=60)))")],
        cwd=site, env=env, timeout=120).strip().splitlines()[-1])
    assert len(result["token"]) == 32
    assert holders.find_one({"_id": result["token"]}) is None  # released after the body
    assert _scrape(tmp, port, cwd=site, env=env).get(GRANTED) == 3, "the worker's grant is not in the scrape"


def _then_the_insights_step_answers_as_the_readme_says(tmp: Path, site: Path, port: int, env: dict[str, str],
                                                       holders) -> str:
    """The tutorial's Insights step as typed, under bash (a failing grep fails the step); the
    token of the lease its ``/hold/`` keeps."""
    base = f"http://127.0.0.1:{port}"
    lines = _bash(_host(INSIGHTS_STEP, tmp, port), cwd=site, env=env).strip().splitlines()
    print("\n".join(lines))
    held = json.loads(lines[0])["token"]
    assert holders.find_one({"_id": held})["tenantId"] == "acme"
    assert lines[1:] == [f'data-token="{held}"', "200", "404",
                         f"302 {base}/accounts/login/?next=/t/acme/insights/leases",
                         "<title>Sign in · Vance</title>"]
    # Beyond what the step greps: the tenant's name comes from the hook, the login page is a 200.
    cookies = dict(line.split() for line in (tmp / "sessions").read_text().splitlines() if len(line.split()) == 2)
    status, page, _ = _get(base + "/t/acme/insights/leases", cookie=cookies["ada"])
    assert status == 200 and held in page and "Acme" in page, page[-2000:]
    status, login, _ = _get(base + "/accounts/login/")
    assert status == 200 and 'name="password"' in login, login[-2000:]
    return held


def _then_a_busy_resource_is_a_429_with_retry_after(tmp: Path, site: Path, port: int, env: dict[str, str]) -> None:
    """The tutorial's busy step: the example's /hold/ does not wait, and a busy resource is a
    429 with Retry-After (whole seconds, at least 1), not a server error."""
    (busy,) = _bash(_host(BUSY_STEP, tmp, port), cwd=site, env=env).strip().splitlines()
    print(busy)
    code, _, retry_after = busy.partition(" Retry-After: ")
    assert code == "429" and int(retry_after) >= 1, busy
    status, body, _ = _get(f"http://127.0.0.1:{port}/hold/")
    assert status == 429 and json.loads(body)["code"] == "LEASE_BUSY", body


def _then_beats_sweep_reaps_the_expired_holder_and_the_scrape_shows_every_process(
        held: str, tmp: Path, site: Path, port: int, env: dict[str, str], mongo: pymongo.MongoClient) -> None:
    """Beat's sweep: the held lease, its TTL made to have run out an hour ago, is reaped (reason
    "idle"). Nothing acquires "tex" from here on, so no acquire's lazy reap of the resource can
    take it instead: only a sweep run by the worker can."""
    holders = mongo[LEASE_DB]["resource_lease_holders"]
    holders.update_one({"_id": held}, {"$set": {"expiresAt": datetime.now(UTC) - timedelta(hours=1)}})
    planted = time.monotonic()
    while holders.find_one({"_id": held}) is not None:
        assert time.monotonic() - planted < 5 * REAP_INTERVAL + 10, "no sweep reaped the expired holder"
        time.sleep(0.2)
    print(f"swept {time.monotonic() - planted:.1f} s after the holder expired")
    # The reap deletes the holder first and writes its tombstone after it has returned the slots.
    tombstones = mongo[LEASE_DB]["lease_tombstones"]
    while (tombstone := tombstones.find_one({"_id": held})) is None:
        assert time.monotonic() - planted < 5 * REAP_INTERVAL + 10, "the reap wrote no tombstone"
        time.sleep(0.1)
    assert tombstone["reason"] == "idle"

    # The tutorial's scrape line as typed: the sweep's reap (the worker's pool child counts it
    # just after the delete, so it may take a moment), and every grant of both processes.
    reaped = ("vance_lease_reap_total", (("reason", "idle"),))
    while (samples := _scrape(tmp, port, cwd=site, env=env)).get(reaped, 0) < 1:
        assert time.monotonic() - planted < 5 * REAP_INTERVAL + 20, "the sweep's reap is not in the scrape"
        time.sleep(0.5)
    assert samples[GRANTED] == 4  # /compile/, /acompile/ and /hold/ in uvicorn, the task in the worker
    assert samples[("vance_lease_acquire_total", (("outcome", "busy"), ("resource", "tex2pdf")))] == 2


# Held by a Django shell, the process a script or a notebook is: it becomes a pod on its acquire.
SHELL_HOLD = """\
import time, leases
lease = leases.acquire(leases.LeaseRequest(type="tex", lease="tex", tenant_id="acme", project_id="shell", user_id="ops"))
for _ in range(int("{seconds}")):
    time.sleep(1); lease.check()  # raises LeaseLost once a sweep reaped it
lease.release(); print("held", lease.token)
"""
HOLD_SECONDS = 3 * REAP_INTERVAL + 1  # at least two of beat's sweeps fall inside every hold


def _beat_sends(log: str) -> list[datetime]:
    """When beat sent the sweep, from its log lines (``[YYYY-mm-dd HH:MM:SS,mmm: INFO/…] … lease-sweep``)."""
    return [datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f") for line in log.splitlines()
            if "Sending due task lease-sweep" in line and line.startswith("[")]


def _when_leases_are_held_across_beats_sweeps(python: str, site: Path, port: int, env: dict[str, str],
                                              mongo: pymongo.MongoClient) -> tuple[datetime, datetime]:
    """An ASGI view under uvicorn, a ``@leased`` task in a worker pool child and ``manage.py
    shell`` each hold a lease of their own process for HOLD_SECONDS, checking it every second,
    while beat's sweep runs every REAP_INTERVAL seconds elsewhere: none is reaped (a reap would
    end its next check in LeaseLost). Returns the window the holds covered (local wall time,
    as beat's log writes it)."""
    import concurrent.futures

    started = datetime.now()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        view = pool.submit(_get, f"http://127.0.0.1:{port}/work/?seconds={HOLD_SECONDS}")
        task = pool.submit(_run, [python, "manage.py", "shell", "-c", (
            "import json; from hostsite.tasks import long_compile\n"
            f"print(json.dumps(long_compile.delay('acme', 'batch', 'dave', {HOLD_SECONDS}).get(timeout=120)))")],
            cwd=site, env=env, timeout=180)
        shell = pool.submit(_run, [python, "manage.py", "shell", "-c", SHELL_HOLD.format(seconds=HOLD_SECONDS)],
                            cwd=site, env=env, timeout=180)
        status, body, _ = view.result(timeout=180)
        assert status == 200, body
        assert json.loads(body)["checks"] == HOLD_SECONDS
        assert len(json.loads(task.result().strip().splitlines()[-1])["token"]) == 32
        assert shell.result().strip().splitlines()[-1].startswith("held ")
    ended = datetime.now()
    reaped = mongo[LEASE_DB]["lease_tombstones"].count_documents({"reason": "pod"})
    assert reaped == 0, f"{reaped} lease(s) reaped as a dead pod's"
    print(f"three leases held {HOLD_SECONDS} s each in uvicorn, a worker pool child and a shell: none reaped")
    return started, ended


@pytest.mark.parametrize(("series", "interpreter"), SERIES)
def test_given_a_fresh_clone_when_a_new_postgresql_project_adopts_the_wheel_then_leases_and_insights_work(
        installs, workdir, series, interpreter):
    tmp, schema, mongo = workdir
    install = installs[series]
    source = install.source
    env = {**_host_env(schema), "REPO": str(source)}  # the tutorial's REPO=$PWD, typed in the clone
    started = install.started

    # 1. The tutorial's install lines: a venv of the newcomer's interpreter, the wheel built by its
    #    pip from the clone, installed with the embedded server and the PostgreSQL driver.
    install.wait()
    (wheel,) = (tmp / "wheels").glob("django_leases-*.whl")
    _then_the_wheel_ships_both_packages_their_data_and_metadata(wheel, source)
    python = _then_the_venv_runs_the_installed_wheel_on_the_series(tmp, env, series, interpreter)

    # 2. A new project: PostgreSQL default, the lease apps on their MongoDB alias.
    site = _when_a_new_postgresql_project_adopts_the_apps(tmp, schema, env, python)
    _then_the_router_kept_each_side_to_its_own(python, site, schema, env, mongo)

    # 4. Real HTTP against the project under uvicorn, a Celery worker and Celery beat of the project.
    port = free_port()
    env, processes = _when_uvicorn_a_worker_and_beat_start(tmp, site, env, port)
    holders = mongo[LEASE_DB]["resource_lease_holders"]
    try:
        _wait_http(f"http://127.0.0.1:{port}/admin/login/", processes["uvicorn"])
        _then_the_views_and_the_leased_task_are_granted_and_scraped(python, tmp, site, port, env, holders)
        held = _then_the_insights_step_answers_as_the_readme_says(tmp, site, port, env, holders)
        _then_a_busy_resource_is_a_429_with_retry_after(tmp, site, port, env)
        _then_beats_sweep_reaps_the_expired_holder_and_the_scrape_shows_every_process(held, tmp, site, port, env,
                                                                                       mongo)
        held_from, held_to = _when_leases_are_held_across_beats_sweeps(python, site, port, env, mongo)
    finally:
        logs = _stopped(processes)
    during = [sent for sent in _beat_sends(logs["beat"]) if held_from <= sent <= held_to]
    assert len(during) >= 2, f"beat sent the sweep {len(during)} times while the leases were held"
    sent = [line for line in logs["beat"].splitlines() if "Sending due task lease-sweep (leases.tasks.sweep)" in line]
    assert sent, logs["beat"][-3000:]
    print(f"beat sent lease-sweep {len(sent)} times; adoption steps took {time.monotonic() - started:.1f} s")


def test_given_the_tutorial_then_it_shows_the_adoption_files_and_commands_as_the_test_uses_them():
    # The steps live in the documentation site's tutorial (docs/tutorial.md); the example files
    # are shown by the site's snippet include (the file itself, so it cannot drift) on the
    # tutorial or the how-to page that explains them.
    tutorial = (REPO / "docs" / "tutorial.md").read_text()
    shown = tutorial + "".join(page.read_text() for page in sorted((REPO / "docs" / "how-to").glob("*.md")))
    for name in ("settings_block.py", "tenancy.py", "tasks.py", "urls.py", "views.py"):
        include = f'--8<-- "examples/hostsite/{name}"'
        assert include in shown or (EXAMPLE / name).read_text().rstrip("\n") in shown, (
            f"the docs no longer show examples/hostsite/{name}")
    for command in (INSTALL, EMBEDDED_SERVER, SITE, MIGRATE, METRICS_DIR + "\n" + WORKER + " &", BEAT + " &",
                    UVICORN + " &", INSIGHTS_STEP, BUSY_STEP + "\n" + SCRAPE_STEP + "kill "):
        assert command in tutorial, f"the tutorial's adoption steps no longer say:\n{command}"
    # The cp list is every host module of examples/hostsite/ (the settings block is appended, not copied).
    assert sorted(HOST_FILES) == sorted(p.stem for p in EXAMPLE.glob("*.py") if p.name != "settings_block.py")
