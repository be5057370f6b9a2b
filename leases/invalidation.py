"""Cross-process invalidation of the definition cache over Redis pub/sub.

Every config document change is published on one channel per database; each process runs
one daemon thread that applies the changes to its local cache. While the subscription is
not confirmed (Redis down, reconnecting) the cache stores nothing, and every (re)connect
clears it, so a change can never be missed silently.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid

import redis

from . import store

log = logging.getLogger(__name__)

_lock = threading.Lock()
_thread: threading.Thread | None = None
_thread_pid: int | None = None
_listening = threading.Event()
_stop = threading.Event()
_origin: tuple[int, str] | None = None


def _origin_id() -> str:
    """This process's sender id (fork-aware): its own messages are already applied locally."""
    global _origin
    if _origin is None or _origin[0] != os.getpid():
        _origin = (os.getpid(), uuid.uuid4().hex)
    return _origin[1]


def _redis_url() -> str:
    from django.conf import settings

    return getattr(settings, "LEASES_REDIS_URL", "redis://127.0.0.1:6379/1")


def channel() -> str:
    """The pub/sub channel of this database (tests use distinct databases)."""
    return f"leases:config:{store.database_name()}"


def _apply(message: dict) -> None:
    from .definitions import cache

    cache.invalidate(message.get("tenantId"), message.get("projectId"), message.get("name"))


def _run(channel_name: str) -> None:
    from .definitions import cache

    backoff = 0.2
    while not _stop.is_set():
        conn = None
        try:
            conn = redis.Redis.from_url(_redis_url(), socket_connect_timeout=2, socket_timeout=5,
                                        health_check_interval=10)
            pubsub = conn.pubsub(ignore_subscribe_messages=False)
            pubsub.subscribe(channel_name)
            while not _stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    cache.clear()  # anything may have changed while we were not listening
                    _listening.set()
                    backoff = 0.2
                elif message["type"] == "message":
                    try:
                        change = json.loads(message["data"])
                        # Our own change was applied when it was published; applying it again
                        # on its way back would only drop entries cached since.
                        if change.get("origin") != _origin_id():
                            _apply(change)
                    except (ValueError, TypeError, AttributeError):
                        cache.clear()
        except redis.RedisError as exc:
            log.warning("config invalidation channel lost (%s); caching paused", exc)
        finally:
            _listening.clear()
            cache.clear()
            if conn is not None:
                try:
                    conn.close()
                except redis.RedisError:
                    pass
        time.sleep(backoff)
        backoff = min(backoff * 2, 5.0)


def start() -> None:
    """Start this process's listener thread if it is not running (fork-aware)."""
    global _thread, _thread_pid
    pid = os.getpid()
    if _thread is not None and _thread_pid == pid and _thread.is_alive():
        return
    with _lock:
        if _thread is not None and _thread_pid == pid and _thread.is_alive():
            return
        _listening.clear()
        _stop.clear()
        _thread = threading.Thread(target=_run, args=(channel(),), name="lease-config-invalidation", daemon=True)
        _thread_pid = pid
        _thread.start()


def listening() -> bool:
    """True when changes from other processes reach this one; starts the listener lazily."""
    start()
    return _listening.is_set()


def wait_listening(timeout: float = 5.0) -> bool:
    """Block until the subscription is confirmed (start-up, tests)."""
    start()
    return _listening.wait(timeout)


def publish(tenant_id: str | None, project_id: str | None, name: str | None) -> None:
    """Tell every process (this one included, directly) that a definition changed."""
    _apply({"tenantId": tenant_id, "projectId": project_id, "name": name})
    try:
        conn = redis.Redis.from_url(_redis_url(), socket_connect_timeout=2, socket_timeout=2)
        try:
            conn.publish(channel(), json.dumps({"tenantId": tenant_id, "projectId": project_id, "name": name,
                                                "origin": _origin_id()}))
        finally:
            conn.close()
    except redis.RedisError as exc:
        # Other processes' listeners reconnect and clear on their own when Redis is back;
        # entries they hold meanwhile expire after LEASES_DEFINITION_CACHE_SECONDS.
        log.error("could not publish config change for %s: %s", name, exc)
