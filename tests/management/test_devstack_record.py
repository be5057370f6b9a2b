"""``manage.py`` in a second terminal: the dev stack's server record, and the no-server error.

The commands run as real OS processes with ``MONGODB_URI`` unset, as a newcomer's second
terminal next to ``bash scripts/dev.sh`` has it; ``LEASES_DEVSTACK_RECORD`` points them at a
record in the test's temp dir instead of the checkout's ``var/devstack.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

import leases
from config.devstack import DevstackRecord, record_path, recorded_server, remove_record, write_record
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.revocation import handlers
from leases.store import client as store
from tests.helpers import PYTHON, REPO


class NoopHandler(handlers.LeaseHandler):
    type = "devstacktest"

    def on_revoked(self, holder):
        pass


@pytest.fixture
def handler():
    h = handlers.register_handler(NoopHandler())
    yield h
    handlers.unregister_handler("devstacktest")


def second_terminal_env(record: os.PathLike) -> dict[str, str]:
    """The environment of a fresh shell: no MONGODB_URI / MONGODB_DB, the record overridden."""
    env = {key: value for key, value in os.environ.items() if key not in {"MONGODB_URI", "MONGODB_DB"}}
    env.update({
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "LEASES_DEVSTACK_RECORD": str(record),
        "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", ""),
    })
    return env


def manage(record: os.PathLike, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "manage.py", *args], cwd=REPO, env=second_terminal_env(record),
                          capture_output=True, text=True, timeout=60)


def exited_pid() -> int:
    """The pid of a process that has already exited (a dev stack killed with SIGKILL)."""
    proc = subprocess.Popen([PYTHON, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_given_a_running_dev_stacks_record_when_manage_runs_without_mongodb_uri_then_it_uses_that_server(
        tmp_path, handler):
    # Given: a holder in the test database, and a record naming the test server and database,
    # written by a live process (this test's own), as the dev stack writes it.
    config.put_document("_vance", "_tenant", document_path("devstacklease"),
                        "resource: devstackres\nlevels: {global: 5}\nttlSeconds: 60")
    lease = leases.acquire(leases.LeaseRequest(type="devstacktest", lease="devstacklease", tenant_id="acme",
                                               project_id="docs", user_id="alice", holder_ref="record-test"))
    record = write_record(DevstackRecord(mongodb_uri=settings.MONGODB_URI, mongodb_db=store.database_name(),
                                         web_urls=("http://127.0.0.1:8000", "http://127.0.0.1:8001"),
                                         pid=os.getpid()), tmp_path / "devstack.json")

    # When: a command runs with MONGODB_URI unset.
    result = manage(record, "lease", "list", "--resource", "devstackres", "--json")

    # Then: it read the holder from the recorded server's database.
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    assert [item["token"] for item in listing["items"]] == [lease.token]
    assert oct(record.stat().st_mode & 0o777) == "0o600"  # the URI may carry credentials


def test_given_no_server_and_no_dev_stack_when_manage_runs_then_it_names_what_works(tmp_path):
    result = manage(tmp_path / "devstack.json", "lease", "list")

    assert result.returncode == 2
    assert result.stdout == ""
    message = result.stderr.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1
    assert "MONGODB_URI is not set and no dev stack is running" in message
    assert "`bash scripts/dev.sh`" in message and "set MONGODB_URI" in message
    assert "devserver_embedded" not in message


def test_given_the_record_of_a_dev_stack_that_died_then_it_is_ignored_and_the_error_says_so(tmp_path):
    dead = exited_pid()
    record = write_record(DevstackRecord(mongodb_uri=settings.MONGODB_URI, mongodb_db=store.database_name(),
                                         web_urls=(), pid=dead), tmp_path / "devstack.json")

    result = manage(record, "lease", "list")

    assert result.returncode == 2 and result.stdout == ""
    assert f"the dev stack that wrote {record} (pid {dead}) is no longer running" in result.stderr
    assert "`bash scripts/dev.sh`" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("body", ["{not json", '{"mongodbUri": "mongodb://x"}', '["a list"]',
                                  '{"mongodbUri": "mongodb://x", "mongodbDb": "leases", "pid": "1"}'])
def test_given_a_broken_record_then_manage_fails_closed_naming_the_file(tmp_path, body):
    record = tmp_path / "devstack.json"
    record.write_text(body)

    result = manage(record, "lease", "list")

    assert result.returncode == 2 and result.stdout == ""
    assert f"dev stack record {record}" in result.stderr and "set MONGODB_URI" in result.stderr
    assert "Traceback" not in result.stderr


def test_record_path_defaults_to_var_and_is_overridable(monkeypatch, tmp_path):
    monkeypatch.delenv("LEASES_DEVSTACK_RECORD", raising=False)
    assert record_path() == Path(REPO) / "var" / "devstack.json"
    monkeypatch.setenv("LEASES_DEVSTACK_RECORD", str(tmp_path / "x.json"))
    assert record_path() == tmp_path / "x.json"


def test_a_stopping_stack_removes_only_its_own_record(tmp_path):
    path = tmp_path / "devstack.json"
    write_record(DevstackRecord("mongodb://127.0.0.1:1/", "leases", (), os.getpid()), path)

    # A stack with another pid (an older one shutting down late) leaves the newer record.
    remove_record(os.getpid() + 1, path)
    assert recorded_server(path) == DevstackRecord("mongodb://127.0.0.1:1/", "leases", (), os.getpid())

    remove_record(os.getpid(), path)
    assert not path.exists()
    assert recorded_server(path) is None


def test_given_a_record_whose_pid_now_names_another_process_then_it_is_ignored(tmp_path):
    # The stack died and its pid was handed to an unrelated process (here: this one, with a
    # start time that differs from the recorded one).
    path = write_record(DevstackRecord(settings.MONGODB_URI, store.database_name(), (), os.getpid()),
                        tmp_path / "devstack.json")
    body = json.loads(path.read_text())
    assert isinstance(body["pidStartTicks"], int)
    assert recorded_server(path) is not None
    body["pidStartTicks"] += 1
    path.write_text(json.dumps(body))

    assert recorded_server(path) is None
    result = manage(path, "lease", "list")
    assert result.returncode == 2 and "is no longer running" in result.stderr


def start_stack(record: os.PathLike, **env: str) -> subprocess.CompletedProcess:
    """``python -m config.devstack`` as dev.sh runs it; only start-up refusals are exercised here.

    Own process group: should the refusal regress, the whole stack it started is killed at
    the timeout instead of outliving the test.
    """
    proc = subprocess.Popen([PYTHON, "-m", "config.devstack"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**second_terminal_env(record), **env})
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_given_a_running_stack_of_this_checkout_when_another_starts_then_it_refuses(tmp_path):
    record = write_record(DevstackRecord("mongodb://127.0.0.1:1/", "leases", ("http://127.0.0.1:8000",),
                                         os.getpid()), tmp_path / "devstack.json")
    before = record.read_text()

    result = start_stack(record)

    assert result.returncode == 1
    assert f"a dev stack of this checkout is already running (pid {os.getpid()}" in result.stderr
    assert "embedded MongoDB-compatible server" not in result.stdout  # nothing was started
    assert record.read_text() == before


@pytest.mark.parametrize("port", ["abc", "0", "65535"])
def test_given_a_bad_dev_web_port_then_the_stack_refuses_before_starting_anything(tmp_path, port):
    result = start_stack(tmp_path / "devstack.json", DEV_WEB_PORT=port)

    assert result.returncode == 1
    assert "DEV_WEB_PORT must be a port number" in result.stderr and repr(port) in result.stderr
    assert result.stdout == "" and not (tmp_path / "devstack.json").exists()


def test_given_a_web_port_in_use_then_the_stack_refuses_and_names_dev_web_port(tmp_path):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        result = start_stack(tmp_path / "devstack.json", DEV_WEB_PORT=str(taken))

    assert result.returncode == 1
    assert f"port {taken} on 127.0.0.1 is in use; set DEV_WEB_PORT" in result.stderr
    assert result.stdout == ""
