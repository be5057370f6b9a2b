"""leases.queue.wakeups over real Redis pub/sub: a wake-up published for a ticket reaches the
subscriber of the process that registered it (another OS process, or this one), sets that
ticket's event only, and ``wake`` tells delivered, nobody subscribed and unknown apart.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest
import redis

from leases.queue import wakeups
from tests.helpers import PYTHON, REPO, child_env, private_redis

MAIN_REDIS = "redis://127.0.0.1:6379/1"

# A process that registers one ticket, says its wake-up id once subscribed, and reports
# whether its event was set within 20 s.
CHILD = """
import sys, time
import django; django.setup()
from leases.queue import wakeups
event = wakeups.register(sys.argv[1])
deadline = time.monotonic() + 10
while not wakeups._subscribed.is_set() and time.monotonic() < deadline:
    time.sleep(0.01)
print(wakeups.process_id() if wakeups._subscribed.is_set() else "not-subscribed", flush=True)
print("woken" if event.wait(20) else "timeout", flush=True)
"""


@pytest.fixture
def fresh_publisher(monkeypatch, settings):
    """The publisher made again from the current settings, without a backoff left over."""
    settings.LEASES_REDIS_URL = MAIN_REDIS
    monkeypatch.setattr(wakeups, "_publisher", None)
    monkeypatch.setattr(wakeups, "_publish_blocked_until", 0.0)


def subscribed_here() -> None:
    """This process's subscriber is listening (started by a first register)."""
    wakeups.register("probe")
    wakeups.unregister("probe")
    assert wakeups._subscribed.wait(10), "the subscriber never subscribed"


def publish(*messages: str) -> None:
    """Publish ``messages`` to this process's channel with a client of the test's own."""
    client = redis.Redis.from_url(MAIN_REDIS)
    try:
        for message in messages:
            assert client.publish(wakeups.channel(), message) >= 1
    finally:
        client.close()


def test_given_a_ticket_registered_in_another_process_when_woken_then_redis_carries_it_there(fresh_publisher):
    child = subprocess.Popen([PYTHON, "-c", CHILD, "tk-child"], cwd=REPO, env=child_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        process = child.stdout.readline().strip()
        assert process and process != "not-subscribed" and process != wakeups.process_id(), child.stderr.read()

        assert wakeups.wake("tk-child", process) == wakeups.ALIVE

        assert child.stdout.readline().strip() == "woken"
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_given_a_process_with_no_subscriber_when_woken_then_dead(fresh_publisher):
    assert wakeups.wake("tk-gone", "a-process-that-exited") == wakeups.DEAD


@pytest.mark.parametrize("process", [None, ""])
def test_given_a_kept_ticket_whose_poll_waits_in_another_process_then_every_process_hears_of_it(
        process, fresh_publisher):
    # A kept ticket (an HTTP client's) names no process: its wake-up goes out on the channel
    # every process listens on, whose poll may wait for it anywhere; the answer says nothing
    # of its client, who may be between two polls.
    listener = redis.Redis.from_url(MAIN_REDIS).pubsub(ignore_subscribe_messages=True)
    listener.subscribe(wakeups.channel(wakeups.KEPT))
    try:
        assert listener.get_message(timeout=5) is None  # subscribed (the confirmation skipped)
        assert wakeups.wake("tk-http", process) == wakeups.UNKNOWN
        message = listener.get_message(timeout=5)
        assert message is not None and json.loads(message["data"]) == ["tk-http"]
    finally:
        listener.close()


@pytest.mark.parametrize("process", [None, ""])
def test_given_a_kept_ticket_whose_poll_waits_here_then_it_is_woken_here_with_its_grant(process, fresh_publisher):
    event = wakeups.register("tk-http")
    try:
        assert wakeups.grant("tk-http", process, "entry", "fence") == wakeups.ALIVE
        assert event.is_set()
        assert wakeups.take_grant("tk-http") == wakeups.Granted("entry", "fence")
    finally:
        wakeups.unregister("tk-http")


def test_given_a_message_on_this_processs_channel_then_only_the_named_tickets_are_set():
    subscribed_here()
    named, other, dropped = wakeups.register("tk-a"), wakeups.register("tk-b"), wakeups.register("tk-c")
    wakeups.unregister("tk-c")
    try:
        # Messages that are no list of ids are skipped; the subscriber keeps reading.
        publish("not json", json.dumps({"tk-b": 1}), json.dumps([1, None, ["tk-b"]]), json.dumps(["tk-a", "tk-c"]))

        assert named.wait(10)
        time.sleep(0.2)  # one message carried both ids: nothing later can set the others
        assert not other.is_set() and not dropped.is_set()
    finally:
        wakeups.unregister("tk-a")
        wakeups.unregister("tk-b")


def test_given_an_event_subclass_then_the_subscriber_calls_its_set():
    subscribed_here()
    calls: list[str] = []

    class Passing(threading.Event):
        def set(self) -> None:  # the async executor's event wakes its coroutine this way
            calls.append("set")
            super().set()

    event = wakeups.register("tk-async", Passing())
    try:
        publish(json.dumps(["tk-async"]))
        assert event.wait(10) and calls == ["set"]
    finally:
        wakeups.unregister("tk-async")


def test_given_a_frozen_redis_then_wake_answers_unknown_within_its_bound_and_backs_off(fresh_publisher,
                                                                                       settings, monkeypatch):
    monkeypatch.setattr(wakeups, "PUBLISH_BACKOFF_S", 1.0)
    with private_redis() as (url, server):
        settings.LEASES_REDIS_URL = url
        assert wakeups.wake("tk", "nobody-here") == wakeups.DEAD  # connected: a real answer
        server.send_signal(signal.SIGSTOP)

        started = time.monotonic()
        assert wakeups.wake("tk", "nobody-here") == wakeups.UNKNOWN  # never raises
        first = time.monotonic() - started
        started = time.monotonic()
        assert wakeups.wake("tk", "nobody-here") == wakeups.UNKNOWN
        backed_off = time.monotonic() - started

        assert wakeups.PUBLISH_TIMEOUT_S * 0.8 <= first < 2.0, first  # waited for the socket timeout once
        assert backed_off < wakeups.PUBLISH_TIMEOUT_S / 2, backed_off  # did not try again
        server.send_signal(signal.SIGCONT)
        time.sleep(1.1)  # the backoff is over
        assert wakeups.wake("tk", "nobody-here") == wakeups.DEAD


def test_given_a_grant_message_then_its_entry_fence_and_time_reach_the_waiter_once():
    from datetime import datetime

    event = wakeups.register("tk-g")
    try:
        # Given: a grant message as a granter publishes it, with the grant's time in ms.
        at = datetime(2026, 12, 6, 1, 2, 3, 456000)
        message = ["tk-g", {"grant": {"id": "tk-g", "e": "t/p/u/a/tk-g", "f": "F1", "t": 1796518923456}}]
        # When: it arrives. Then: the waiter is woken and takes the grant, once.
        wakeups.on_message(json.dumps(message))
        assert event.is_set()
        assert wakeups.take_grant("tk-g") == wakeups.Granted("t/p/u/a/tk-g", "F1", at)
        assert wakeups.take_grant("tk-g") is None
        # A grant without a time (or a malformed one) is taken without it.
        wakeups.on_message(json.dumps(["tk-g", {"grant": {"id": "tk-g", "e": "e", "f": "f", "t": "soon"}}]))
        assert wakeups.take_grant("tk-g") == wakeups.Granted("e", "f", None)
    finally:
        wakeups.unregister("tk-g")


def test_given_a_grant_taken_late_then_it_comes_without_its_time_so_the_waiter_claims_before_it_answers(settings):
    from datetime import datetime

    settings.LEASES_GRANT_CLAIM_MS = 400
    at = datetime(2026, 12, 7, 1, 0)
    for token, delay, expected in (("tk-fresh", 0.0, at), ("tk-late", 0.15, None)):
        wakeups.register(token)
        try:
            wakeups._note_grant(token, wakeups.Granted("e", "f", at))
            time.sleep(delay)  # past a quarter of the 400 ms window for the late one
            granted = wakeups.take_grant(token)
            assert granted is not None and granted.booking == "e" and granted.at == expected
        finally:
            wakeups.unregister(token)


# A process whose subscriber listens on the Redis of LEASES_REDIS_URL: it says "listening",
# then, after each line on stdin, how long until ``listening()`` changed and how long a wake
# of another process took.
DEAF_CHILD = """
import sys, time
import django; django.setup()
from leases.queue import wakeups

def until(want, bound):
    started = time.monotonic()
    while wakeups.listening() != want and time.monotonic() - started < bound:
        time.sleep(0.02)
    return wakeups.listening() == want, time.monotonic() - started

wakeups.register("tk-deaf")
print("listening" if until(True, 10)[0] else "not-listening", flush=True)
sys.stdin.readline()  # Redis is frozen now
heard, after = until(False, 10)
started = time.monotonic()
answer = wakeups.wake("tk-elsewhere", "another-process")
print(f"deaf {heard} {after:.2f} {answer} {time.monotonic() - started:.3f}", flush=True)
sys.stdin.readline()  # Redis answers again
back, after = until(True, 20)
print(f"back {back} {after:.2f}", flush=True)
"""


def test_given_a_frozen_redis_then_the_subscriber_notices_within_its_bound_and_releases_stop_publishing():
    # Given: a process whose subscriber listens on a Redis of the test's own.
    with private_redis() as (url, server):
        child = subprocess.Popen([PYTHON, "-c", DEAF_CHILD], cwd=REPO, env=child_env(LEASES_REDIS_URL=url),
                                 text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert child.stdout.readline().strip() == "listening", child.stderr.read()
            # When: Redis freezes (its connections stay open, merely quiet).
            server.send_signal(signal.SIGSTOP)
            child.stdin.write("frozen\n")
            child.stdin.flush()
            # Then: the process stops counting on wake-ups within DEAF_AFTER_S (plus a ping
            # period and scheduling), and a wake answers unknown at once, not after the publish
            # timeout.
            _, heard, after, answer, took = child.stdout.readline().split()
            assert heard == "True", after
            assert float(after) <= wakeups.DEAF_AFTER_S + wakeups.PING_EVERY_S + 1.0, after
            assert answer == wakeups.UNKNOWN and float(took) < wakeups.PUBLISH_TIMEOUT_S / 2, took
            # When Redis answers again, the process listens again (a reconnect at most).
            server.send_signal(signal.SIGCONT)
            child.stdin.write("continued\n")
            child.stdin.flush()
            assert child.stdout.readline().split()[:2] == ["back", "True"]
            assert child.wait(10) == 0
        finally:
            server.send_signal(signal.SIGCONT)
            if child.poll() is None:
                child.kill()
                child.wait(10)
