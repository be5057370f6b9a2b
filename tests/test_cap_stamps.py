"""A lowered cap is in force on every process at once: the definition write stamps it onto
the counters it governs, and a booking from a view loaded before the stamp obeys it."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time

import pytest

import leases
from leases import config, definitions, service, store
from leases.definitions import document_path
from tests.helpers import PYTHON, REPO, child_env, private_redis
from tests.test_invalidation import CAPS, command, start_holder, stop

# Process B, started (and Django set up) before Redis freezes: writes the System layer on
# each line it reads and answers how long the write took.
STANDING_WRITER = textwrap.dedent("""
    import json, sys, time
    import django
    django.setup()
    from leases import config
    from leases.definitions import document_path
    print("ready", flush=True)
    for line in sys.stdin:
        started = time.monotonic()
        config.put_document("_vance", "_tenant", document_path("tex"), line.strip())
        print(json.dumps({"seconds": time.monotonic() - started}), flush=True)
""")


def test_given_a_frozen_redis_when_another_process_lowers_the_cap_then_the_stale_cache_cannot_book_past_it():
    with private_redis() as (url, redis_server):
        config.put_document("_vance", "_tenant", document_path("tex"), CAPS.format(2))
        # given: A holds 1 of a global cap of 2, the definition cached and served (live)
        holder, first = start_holder(url)
        writer = subprocess.Popen([PYTHON, "-c", STANDING_WRITER], cwd=REPO, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  env=child_env(LEASES_REDIS_URL=url, LEASES_INVALIDATION_LIVENESS_MS="200"))
        try:
            assert writer.stdout.readline().strip() == "ready"
            assert first == {"cap": 2, "listening": True, "cached": True}
            # when: Redis freezes and B lowers the cap to 1 (its change event cannot reach A)
            redis_server.send_signal(signal.SIGSTOP)
            frozen = time.monotonic()
            assert command(writer, CAPS.format(1))["seconds"] < 2.0
            # then: A, still serving its cached cap of 2 within its liveness bound, is refused
            answer = command(holder, "acquire")
            assert time.monotonic() - frozen < 2.0  # A's cache was still being served: no lapse
            assert (answer["outcome"], answer["cap"]) == ("busy", 2), answer
            # and the stored cap is the lowered one: A's attempt did not raise it back
            assert store.counters().find_one({"_id": "tex2pdf|global|*"})["cap"] == 1
        finally:
            redis_server.send_signal(signal.SIGCONT)
            stop(holder)
            writer.stdin.close()
            writer.wait(timeout=10)
