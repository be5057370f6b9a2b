"""Wake-ups for waiting tickets over Redis pub/sub: one subscriber thread per process.

Whoever frees a gate slot (release, rollback, reap, revoke) publishes the ids of the
tickets the order rule picked; each process's subscriber sets the event of its own waiters
among them, so only the waiters that may run do any work. A lost or late message costs
time, never safety: every waiter also polls on its own, slowly, and the store decides.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable

import redis

from . import store

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 0.25
# After a failed publish, skip publishing this long: a frozen Redis must not add its
# timeout to every release.
PUBLISH_BACKOFF_S = 1.0

_lock = threading.Lock()
_events: dict[str, threading.Event] = {}
_thread: threading.Thread | None = None
_thread_pid: int | None = None
_publisher: redis.Redis | None = None
_publisher_pid: int | None = None
_publish_blocked_until = 0.0


def _redis_url() -> str:
    from django.conf import settings

    return getattr(settings, "LEASES_REDIS_URL", "redis://127.0.0.1:6379/1")


def channel() -> str:
    """The wake-up channel of this database (tests and benches use distinct databases)."""
    return f"leases:wake:{store.database_name()}"


def register(ticket_id: str) -> threading.Event:
    """The event a waiter sleeps on; starts this process's subscriber on first use."""
    event = threading.Event()
    with _lock:
        _events[ticket_id] = event
    _ensure_listening()
    return event


def unregister(ticket_id: str) -> None:
    with _lock:
        _events.pop(ticket_id, None)


def _deliver(ticket_ids: Iterable[str]) -> int:
    woken = 0
    with _lock:
        for ticket_id in ticket_ids:
            event = _events.get(ticket_id)
            if event is not None:
                event.set()
                woken += 1
    return woken


def publish(ticket_ids: list[str]) -> None:
    """Wake the waiters of ``ticket_ids``, wherever they run. Never raises.

    Local waiters are woken directly (no round trip); the message reaches the others.
    """
    global _publisher, _publisher_pid, _publish_blocked_until
    if not ticket_ids:
        return
    if _deliver(ticket_ids) == len(ticket_ids):
        return
    now = time.monotonic()
    if now < _publish_blocked_until:
        return
    try:
        if _publisher is None or _publisher_pid != os.getpid():
            _publisher = redis.Redis.from_url(_redis_url(), socket_connect_timeout=PUBLISH_TIMEOUT_S,
                                              socket_timeout=PUBLISH_TIMEOUT_S)
            _publisher_pid = os.getpid()
        _publisher.publish(channel(), json.dumps(ticket_ids))
    except redis.RedisError as exc:
        _publish_blocked_until = now + PUBLISH_BACKOFF_S
        log.debug("wake-up publish failed (%s); waiters fall back to polling", exc)


def _ensure_listening() -> None:
    global _thread, _thread_pid
    pid = os.getpid()
    if _thread is not None and _thread_pid == pid and _thread.is_alive():
        return
    with _lock:
        if _thread is not None and _thread_pid == pid and _thread.is_alive():
            return
        _thread = threading.Thread(target=_run, args=(channel(),), name="lease-wakeups", daemon=True)
        _thread_pid = pid
        _thread.start()


def _run(channel_name: str) -> None:
    backoff = 0.2
    while True:
        try:
            conn = redis.Redis.from_url(_redis_url(), socket_connect_timeout=2, socket_timeout=5,
                                        health_check_interval=10)
            pubsub = conn.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(channel_name)
            backoff = 0.2
            while True:
                message = pubsub.get_message(timeout=1.0)
                if message is None or message.get("type") != "message":
                    continue
                try:
                    ids = json.loads(message["data"])
                except (TypeError, ValueError):
                    continue
                if isinstance(ids, list):
                    _deliver(i for i in ids if isinstance(i, str))
        except redis.RedisError as exc:
            log.debug("wake-up subscriber lost Redis (%s); reconnecting", exc)
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
