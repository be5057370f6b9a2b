"""Cross-process cache invalidation: a change written by one OS process reaches another."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time

import redis

from leases.conf import lease_settings
from leases.definitions import invalidation, layers as config, model as definitions
from leases.definitions.model import document_path
from leases.store import client as store
from tests.helpers import PYTHON, REPO, child_env, private_redis

CHILD = textwrap.dedent("""
    import json, sys, time
    import django
    django.setup()
    from leases.definitions import model as definitions, invalidation
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


# A process that holds a lease and keeps resolving one cache key: its cached definition is
# what decides admission. Commands on stdin: "acquire" (admit-and-release, or busy) and
# "state"; each answers one JSON line.
HOLDER_CHILD = textwrap.dedent("""
    import json, sys
    import django
    django.setup()
    import leases
    from leases.definitions import model as definitions, invalidation

    request = leases.LeaseRequest(type="tex", lease="tex", tenant_id="t1", project_id="p1", user_id="u1",
                                  pod="", wait_ms=0)
    assert invalidation.wait_listening(10)
    held = leases.acquire(request)  # noqa: F841 - kept for the whole run

    def state(**extra):
        levels = definitions.resolve("tex", "t1", "p1").levels
        return dict(extra, cap=levels["global"], listening=invalidation.listening(),
                    cached=("t1", "p1", "tex") in definitions.cache._entries)

    print(json.dumps(state()), flush=True)
    for line in sys.stdin:
        if line.strip() == "acquire":
            try:
                lease = leases.acquire(request)
            except leases.LeaseBusy:
                print(json.dumps(state(outcome="busy")), flush=True)
            else:
                lease.release()
                print(json.dumps(state(outcome="admitted")), flush=True)
        else:
            print(json.dumps(state()), flush=True)
""")

# Process B: writes the System layer with its change event going to LEASES_REDIS_URL and
# prints how long put_document took.
WRITER_CHILD = textwrap.dedent("""
    import json, sys, time
    import django
    django.setup()
    from leases.definitions import layers as config
    from leases.definitions.model import document_path
    started = time.monotonic()
    config.put_document("_vance", "_tenant", document_path("tex"), sys.argv[1])
    print(json.dumps({"seconds": time.monotonic() - started}), flush=True)
""")

CAPS = "levels: {{global: {0}, tenant: 10, project: 10, user: 10}}"


def command(proc, text):
    proc.stdin.write(text + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def poll(proc, text, condition, within):
    """Ask ``proc`` until ``condition(answer)`` holds or ``within`` seconds pass; the last answer."""
    deadline = time.monotonic() + within
    answer = command(proc, text)
    while not condition(answer) and time.monotonic() < deadline:
        time.sleep(0.05)
        answer = command(proc, text)
    return answer


def start_holder(redis_url, **extra):
    proc = subprocess.Popen([PYTHON, "-c", HOLDER_CHILD], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=child_env(LEASES_REDIS_URL=redis_url,
                                                     LEASES_DEFINITION_CACHE_SECONDS="3600", **extra))
    return proc, json.loads(proc.stdout.readline())


def stop(proc):
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_given_a_frozen_redis_when_another_process_lowers_the_cap_then_the_old_cap_stops_admitting_within_the_bound():
    with private_redis() as (url, redis_server):
        config.put_document("_vance", "_tenant", document_path("tex"), CAPS.format(2))
        # given: A holds 1 of a global cap of 2, the definition cached, subscribed to its Redis
        holder, first = start_holder(url)
        try:
            assert first == {"cap": 2, "listening": True, "cached": True}
            assert command(holder, "acquire")["outcome"] == "admitted"
            # when: that Redis freezes (a hung connection raises nothing) and B lowers the cap to 1
            redis_server.send_signal(signal.SIGSTOP)
            writer = subprocess.run([PYTHON, "-c", WRITER_CHILD, CAPS.format(1)], cwd=REPO, capture_output=True,
                                    text=True, timeout=60,
                                    env=child_env(LEASES_REDIS_URL=url, LEASES_INVALIDATION_LIVENESS_MS="1000"))
            assert writer.returncode == 0, writer.stderr
            # then: the lowered cap is in force at once (the write stamped it onto the counter), even
            # while A's cache still says 2 and its frozen subscription still looks alive
            assert command(holder, "acquire")["outcome"] == "busy"
            # and within the bound (2 s by default) A stops trusting its cache and reads the cap of 1
            answer = poll(holder, "acquire", lambda a: a["cap"] == 1, within=2.0 + 8)
            assert (answer["outcome"], answer["cap"], answer["listening"]) == ("busy", 1, False)
            # and B's change event waited at most its bound (1 s here) on the frozen Redis,
            # plus the store write
            assert json.loads(writer.stdout)["seconds"] < 2.0
        finally:
            redis_server.send_signal(signal.SIGCONT)
            stop(holder)


def test_given_a_change_whose_event_was_lost_in_a_freeze_when_redis_resumes_then_entries_from_before_are_not_served():
    with private_redis() as (url, redis_server):
        config.put_document("_vance", "_tenant", document_path("tex"), CAPS.format(2))
        holder, first = start_holder(url, LEASES_INVALIDATION_LIVENESS_MS="500")
        try:
            assert first["cap"] == 2 and first["cached"]
            redis_server.send_signal(signal.SIGSTOP)
            # when: the cap changes in the store and its change event never reaches Redis
            store.config_documents().update_one({"tenantId": "_vance", "projectId": "_tenant",
                                                 "path": document_path("tex")}, {"$set": {"text": CAPS.format(1)}})
            # An entry younger than the liveness bound (0.5 s) may still be served once the
            # proof lapsed (it holds every change made before its load): the old cap is gone
            # within that bound past the lapse, not at the first answer that sees the lapse.
            answer = poll(holder, "state", lambda a: not a["listening"] and a["cap"] == 1, within=0.5 + 8)
            assert (answer["listening"], answer["cap"]) == (False, 1)
            redis_server.send_signal(signal.SIGCONT)
            # then: once the subscription proves itself again, A caches anew, and what it
            # cached before the freeze is gone (the old connection's answers say nothing
            # about what was published while nobody could hear)
            answer = poll(holder, "state", lambda a: a["listening"] and a["cached"], within=10)
            assert answer == {"cap": 1, "listening": True, "cached": True}
        finally:
            redis_server.send_signal(signal.SIGCONT)
            stop(holder)


def test_a_liveness_bound_above_two_seconds_is_refused_at_start_up():
    result = subprocess.run([PYTHON, "-c", "import django; django.setup()"], cwd=REPO, capture_output=True, text=True,
                            timeout=60, env=child_env(LEASES_INVALIDATION_LIVENESS_MS="5000"))
    assert result.returncode != 0
    assert "LEASES_INVALIDATION_LIVENESS_MS must be between 100 and 2000" in result.stderr


# --- the own-origin filter ------------------------------------------------------------------


def test_given_a_change_from_another_sender_then_it_is_applied_and_ones_own_is_not():
    assert invalidation._from_elsewhere({"origin": "other-process", "name": "tex"}, "me")
    assert invalidation._from_elsewhere({"name": "tex"}, "me")  # no origin: a foreign writer
    assert not invalidation._from_elsewhere({"origin": "me", "name": "tex"}, "me")


def send(message) -> None:
    """Publish ``message`` on the channel as any writer would (its own connection)."""
    sender = redis.Redis.from_url(lease_settings.REDIS_URL)
    try:
        sender.publish(invalidation.channel(), message if isinstance(message, bytes) else json.dumps(message))
    finally:
        sender.close()


def cached_tex() -> bool:
    definitions.cache.clear()
    assert invalidation.wait_listening(10)
    assert definitions.resolve("tex", "acme", "p1").levels["project"] == 1
    return ("acme", "p1", "tex") in definitions.cache._entries


def test_given_ones_own_change_comes_back_over_redis_then_entries_cached_since_stay():
    assert cached_tex()
    # when: a change event with this process's own sender id arrives after the entry was cached
    send({"tenantId": "acme", "projectId": "p1", "name": "tex", "origin": invalidation._origin_id()})
    # then: it was applied when it was published, so the entry stays
    assert invalidation.caught_up(10)
    assert ("acme", "p1", "tex") in definitions.cache._entries


def test_given_the_same_change_from_another_sender_then_the_entry_is_dropped():
    assert cached_tex()
    send({"tenantId": "acme", "projectId": "p1", "name": "tex", "origin": "another-process"})
    assert invalidation.caught_up(10)
    assert ("acme", "p1", "tex") not in definitions.cache._entries


def test_given_a_malformed_message_then_the_whole_cache_is_dropped():
    assert cached_tex()
    send(b"{not json")
    assert invalidation.caught_up(10)
    assert not definitions.cache._entries
