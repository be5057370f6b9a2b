"""Wake-ups for waiting tickets over Redis pub/sub: one subscriber thread per process.

Each process subscribes to a channel of its own (``leases:wake:<db>:<process id>``) and its
tickets carry that id (``w``). Whoever frees a gate slot publishes the picked ticket ids to
their processes' channels; the subscriber sets the events of those waiters only, so only
the waiters that may run do any work. ``PUBLISH`` answers how many subscribers got the
message; none is no proof that the waiter is gone (a Redis restart or a subscriber's
reconnect looks the same), so it costs no waiter its ticket: only the ticket's keep-alive
says whether its waiter lives (``leases.queue.waiting.hand_off``).

A lost or late message costs time, never safety: every waiter also polls on its own,
slowly, and the store decides. With Redis down nothing is known about liveness and the
tickets' TTL decides, as without wake-ups.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import redis

from ..store import client as store

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 0.25
# After a failed publish, skip publishing this long: a frozen Redis must not add its
# timeout to every release.
PUBLISH_BACKOFF_S = 1.0
# How long a first waiter waits for its process's subscription before it queues: a ticket
# published to before the subscription exists would look like a dead process's.
SUBSCRIBE_WAIT_S = 0.5
# The subscriber pings Redis this often: a Redis that stops answering (frozen, or a network
# that drops the connection silently) leaves a subscribed connection open and merely quiet,
# and redis-py's own health check waits for no answer.
PING_EVERY_S = 0.5
#: Not heard from Redis (a message or a ping's answer) for this long: this process is not
#: listening (:func:`listening`): its watcher polls within the claim window, and its releases
#: publish nothing (each would wait out the publish timeout for a wake-up nobody gets).
DEAF_AFTER_S = 1.5
# Not heard for this long: the connection is given up and made again.
RECONNECT_AFTER_S = 5.0

ALIVE, DEAD, UNKNOWN = "alive", "dead", "unknown"
#: The channel every process also listens on, for tickets kept for an HTTP client: they
#: name no process (any web process may serve the next poll), so their wake-ups go to all,
#: and the process where a poll waits for its ticket (:mod:`leases.engine.kept`) acts on it.
#: A process id is 16 hex digits, so this name is never one.
KEPT = "kept"

_lock = threading.Lock()
_events: dict[str, threading.Event] = {}
_thread: threading.Thread | None = None
_thread_pid: int | None = None
_subscribed = threading.Event()
_heard = 0.0  # monotonic: when the subscriber last heard from Redis
_process: tuple[int, str] | None = None
_publisher: redis.Redis | None = None
_publisher_pid: int | None = None
_publish_blocked_until = 0.0
# Ticket id -> (entry, fence, MongoDB's clock at the grant) of a grant made for it
# (leases.queue.grants), until its waiter takes it; only this process's registered waiters.
_grants: dict[str, "Granted"] = {}
# Ticket id -> monotonic time its grant's news arrived here (see take_grant).
_received: dict[str, float] = {}
# Ticket ids whose waiter this process's gate watcher asked to look at the gate again (its
# ticket left the queue: granted, or pruned), until the waiter takes the request.
_looks: set[str] = set()


class Granted(NamedTuple):
    """What a wake-up says was granted: the booked entry, the fence, and when (MongoDB's
    clock, as the grant's own command saw it; None from a granter that did not say)."""

    booking: str
    fence: str
    at: datetime | None = None


def _redis_url() -> str:
    from leases.conf import lease_settings

    return lease_settings.REDIS_URL


def process_id() -> str:
    """This process's wake-up id (fork-aware: a forked child gets its own)."""
    global _process
    if _process is None or _process[0] != os.getpid():
        _process = (os.getpid(), uuid.uuid4().hex[:16])
    return _process[1]


def channel(process: str | None = None) -> str:
    """The wake-up channel of a process in this database (tests use distinct databases)."""
    return f"leases:wake:{store.database_name()}:{process or process_id()}"


def register(ticket_id: str, event: threading.Event | None = None) -> threading.Event:
    """The event a waiter sleeps on (``event``, or a new one); starts this process's
    subscriber on first use and waits briefly until it is subscribed (never longer than
    ``SUBSCRIBE_WAIT_S``). The subscriber thread calls the event's ``set()``, so a subclass
    may pass the wake-up on (the async executor's wakes its coroutine)."""
    event = event if event is not None else threading.Event()
    with _lock:
        _events[ticket_id] = event
    if _ensure_listening():
        _subscribed.wait(SUBSCRIBE_WAIT_S)
    return event


def _subscribed_here() -> bool:
    """This process's subscriber thread runs and has subscribed (fork-aware)."""
    return _thread is not None and _thread_pid == os.getpid() and _thread.is_alive() and _subscribed.is_set()


def listening() -> bool:
    """Whether this process's subscriber is subscribed and Redis answers it: a grant's
    wake-up can reach its waiters (False while Redis is unreachable or frozen — not heard for
    :data:`DEAF_AFTER_S` — and before the first subscription)."""
    return _subscribed_here() and time.monotonic() - _heard < DEAF_AFTER_S


def _deaf() -> bool:
    """This process's subscriber was subscribed but has not heard from Redis lately: a
    publish now would most likely wait out its timeout."""
    return _subscribed_here() and time.monotonic() - _heard >= DEAF_AFTER_S


def unregister(ticket_id: str) -> None:
    with _lock:
        _events.pop(ticket_id, None)
        _grants.pop(ticket_id, None)
        _received.pop(ticket_id, None)
        _looks.discard(ticket_id)


def nudge(ticket_id: str) -> bool:
    """Wake this process's waiter of ``ticket_id`` to look at its gate again (not to take a
    turn); False when no such waiter is registered here."""
    with _lock:
        event = _events.get(ticket_id)
        if event is None:
            return False
        _looks.add(ticket_id)
    event.set()
    return True


def take_look(ticket_id: str) -> bool:
    """Whether the waiter was nudged (:func:`nudge`) since it last asked; once."""
    with _lock:
        if ticket_id in _looks:
            _looks.discard(ticket_id)
            return True
        return False


def take_grant(ticket_id: str) -> Granted | None:
    """What a wake-up said was granted to ``ticket_id``, once; None without. The grant's time
    comes with it only while the news is fresh here (taken within a quarter of the claim
    window of its arrival): a waiter that takes it later (its process busy, its thread slow
    to run) claims before it answers, rather than answer a grant whose claim window may be
    nearly gone (the fast answer, :func:`leases.engine.claims.claim_later`, needs the time)."""
    from leases.conf import lease_settings

    with _lock:
        granted = _grants.pop(ticket_id, None)
        received = _received.pop(ticket_id, None)
    if granted is not None and received is not None and (
            time.monotonic() - received > int(lease_settings.GRANT_CLAIM_MS) / 4000.0):
        return granted._replace(at=None)
    return granted


def _note_grant(ticket_id: str, granted: Granted) -> None:
    with _lock:
        if ticket_id in _events:
            _grants[ticket_id] = granted
            _received[ticket_id] = time.monotonic()


_EPOCH = datetime(1970, 1, 1)


def grant(ticket_id: str, process: str | None, booking: str, fence: str, at: datetime | None = None) -> str:
    """Wake a waiter whose ticket was granted: the message carries the booked entry, the
    fence and the grant's time on MongoDB's clock (``at``), so it claims without reading the
    gate. Never raises; answers as :func:`wake`."""
    if process == process_id() or not process:
        _note_grant(ticket_id, Granted(booking, fence, at))
    body: dict[str, Any] = {"id": ticket_id, "e": booking, "f": fence}
    if at is not None:
        body["t"] = (at - _EPOCH) // timedelta(milliseconds=1)
    return wake(ticket_id, process, {"grant": body})


def _deliver(ticket_ids: Iterable[str]) -> int:
    woken = 0
    with _lock:
        for ticket_id in ticket_ids:
            event = _events.get(ticket_id)
            if event is not None:
                event.set()
                woken += 1
    return woken


def wake(ticket_id: str, process: str | None, hint: dict[str, Any] | None = None) -> str:
    """Wake one waiter, wherever it runs. Never raises.

    ``hint``: what the waker's own update showed of the gate's free fence slots
    (:func:`leases.queue.fences.hint_of`), published after the id so that the waiter's process
    proposes a slot that is free now (a process without this code ignores it).

    Returns:
        ``ALIVE`` (delivered), ``DEAD`` (its process has no subscriber any more) or
        ``UNKNOWN`` (no process id on the ticket — an HTTP client polls it: the wake-up goes
        to every process, on the :data:`KEPT` channel, for a poll that waits for it — or
        Redis is unreachable).
    """
    global _publisher, _publisher_pid, _publish_blocked_until
    if (process == process_id() or not process) and _deliver([ticket_id]):
        return ALIVE
    # A kept ticket's poll may wait in any web process: all hear of it; whether anyone
    # received it says nothing of the ticket's client (it may be between two polls).
    kept = not process
    now = time.monotonic()
    if now < _publish_blocked_until or _deaf():
        return UNKNOWN
    try:
        if _publisher is None or _publisher_pid != os.getpid():
            _publisher = redis.Redis.from_url(_redis_url(), socket_connect_timeout=PUBLISH_TIMEOUT_S,
                                              socket_timeout=PUBLISH_TIMEOUT_S)
            _publisher_pid = os.getpid()
        received = _publisher.publish(channel(KEPT if kept else process),
                                      json.dumps([ticket_id, *([hint] if hint else [])]))
    except redis.RedisError as exc:
        _publish_blocked_until = now + PUBLISH_BACKOFF_S
        log.debug("wake-up publish failed (%s); waiters fall back to polling", exc)
        return UNKNOWN
    if kept:
        return UNKNOWN
    return ALIVE if received else DEAD


def on_message(data: Any) -> None:
    """Act on one wake-up message: ``[ticket id, ..., hint?]``. The hints (dicts) reach the
    fence views before the waiters wake, so their bookings propose the freed slots. Never
    raises on a malformed message (it is dropped)."""
    try:
        items = json.loads(data)
    except (TypeError, ValueError):
        return
    if not isinstance(items, list):
        return
    from . import fences

    for hint in items:
        if isinstance(hint, dict):
            fences.note_hint(hint)
            granted = hint.get("grant")
            if isinstance(granted, dict) and all(isinstance(granted.get(k), str) for k in ("id", "e", "f")):
                at = granted.get("t")
                when = _EPOCH + timedelta(milliseconds=at) if isinstance(at, int) and not isinstance(at, bool) else None
                _note_grant(granted["id"], Granted(granted["e"], granted["f"], when))
    _deliver(i for i in items if isinstance(i, str))


def _ensure_listening() -> bool:
    """Start the subscriber if this process has none; True when it was started just now."""
    global _thread, _thread_pid
    pid = os.getpid()
    if _thread is not None and _thread_pid == pid and _thread.is_alive():
        return False
    with _lock:
        if _thread is not None and _thread_pid == pid and _thread.is_alive():
            return False
        _subscribed.clear()
        _thread = threading.Thread(target=_run, args=(channel(),), name="lease-wakeups", daemon=True)
        _thread_pid = pid
        _thread.start()
        return True


def _run(channel_name: str) -> None:
    global _heard
    backoff = 0.2
    while True:
        pubsub = None
        try:
            conn = redis.Redis.from_url(_redis_url(), socket_connect_timeout=2, socket_timeout=5,
                                        health_check_interval=10)
            pubsub = conn.pubsub(ignore_subscribe_messages=False)
            pubsub.subscribe(channel_name, channel(KEPT))
            backoff = 0.2
            pinged = time.monotonic()
            while True:
                message = pubsub.get_message(timeout=PING_EVERY_S / 2)
                now = time.monotonic()
                if message is not None:
                    _heard = now
                elif now - _heard > RECONNECT_AFTER_S and _subscribed.is_set():
                    raise redis.ConnectionError(f"no answer from Redis for {RECONNECT_AFTER_S:g} s")
                if now - pinged >= PING_EVERY_S:
                    pubsub.ping()
                    pinged = now
                if message is None:
                    continue
                if message.get("type") == "subscribe":
                    _subscribed.set()
                    continue
                if message.get("type") != "message":
                    continue
                on_message(message["data"])
        except redis.RedisError as exc:
            _subscribed.clear()
            log.debug("wake-up subscriber lost Redis (%s); reconnecting", exc)
            if pubsub is not None:
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is dropped anyway
                    pass
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
