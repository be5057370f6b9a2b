"""Cross-process cache invalidation: a change written by one OS process reaches another."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

from leases import config
from leases.definitions import document_path
from tests.helpers import PYTHON, REPO, child_env

CHILD = textwrap.dedent("""
    import json, sys, time
    import django
    django.setup()
    from leases import definitions, invalidation
    assert invalidation.wait_listening(10)
    print(json.dumps(definitions.resolve("tex", "acme", "p1").levels), flush=True)
    for line in sys.stdin:
        # keep answering from the cache: only an invalidation can change the answer
        print(json.dumps(definitions.resolve("tex", "acme", "p1").levels), flush=True)
""")


def ask(proc):
    proc.stdin.write("?\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def test_given_two_processes_when_one_writes_a_document_then_the_other_drops_its_cache():
    proc = subprocess.Popen([PYTHON, "-c", CHILD], cwd=REPO, env=child_env(LEASES_DEFINITION_CACHE_SECONDS="3600"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(proc.stdout.readline())
        assert first["project"] == 1
        # when: this process (another OS process) changes the project layer
        config.put_document("acme", "p1", document_path("tex"), "levels: {project: 4}")
        deadline = time.monotonic() + 5
        seen = ask(proc)
        while seen.get("project") != 4 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = ask(proc)
        # then: the child sees the new value although its cache entry had an hour to live
        assert seen["project"] == 4
        config.put_document("_vance", "_tenant", document_path("tex"), "levels: {global: 2}")
        deadline = time.monotonic() + 5
        seen = ask(proc)
        while seen.get("global") != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = ask(proc)
        assert seen["global"] == 2
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
