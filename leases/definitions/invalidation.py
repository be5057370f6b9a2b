"""Cross-process invalidation of the definition cache over Redis pub/sub, with bounded staleness.

Every config document change is published on one channel per database; each process runs
one daemon thread that applies the changes to its local cache.

A subscription only counts as *live* while it has proven itself recently: the thread sends
PING on the subscribed connection every quarter of ``LEASES_INVALIDATION_LIVENESS_MS`` and
Redis answers it in order with the published messages, so an answer to a ping sent at
``t`` means every change Redis took before ``t`` has been applied here. The cache serves an
entry only while the freshest answered ping was sent less than the bound ago. A frozen or
partitioned Redis answers nothing (a hung TCP connection raises no error), so within the
bound every read goes to the layers again.

Entries also belong to a live period (an *epoch*): a (re)subscription, a lost connection or
an answer that arrives after the previous proof had already gone stale starts a new epoch
and empties the cache, because changes may have been published while nobody could hear
them; an entry of an earlier epoch is never served.

The subscription tells its subscriber (the definition cache, attached by the app's
``ready()`` through :func:`attach`) what it learns: a change, a proof with its deadline, a
lost connection. The cache never asks, and this module never imports it. The thread is
started explicitly (:func:`start`) by the processes that serve — a web process on its first
request, each Celery worker process once it exists (:mod:`leases.pods.process`) — never at import
or app start: a prefork pool forks after the parent set up, and commands that never resolve
a definition (``migrate``, most of the CLI) never open a Redis connection.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from typing import Any, Protocol

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..store import client as store

log = logging.getLogger(__name__)

DEFAULT_LIVENESS_MS = 2000

_lock = threading.Lock()
_thread: threading.Thread | None = None
_thread_pid: int | None = None
_stop = threading.Event()
_proved = threading.Condition()
_origin: tuple[int, str] | None = None
# (epoch, monotonic send time of the freshest answered ping or None); replaced as a whole
# so a reader never sees an epoch with another epoch's proof.
_state: tuple[int, float | None] = (0, None)


class Subscriber(Protocol):
    """What the subscription tells (the definition cache implements it)."""

    def invalidate(self, tenant_id: str | None, project_id: str | None, name: str | None) -> None:
        """A definition changed: drop what it touched."""

    def clear(self) -> None:
        """Anything may have changed: drop everything."""

    def live_until(self, epoch: int, deadline: float) -> None:
        """Changes reach this process until ``deadline`` (monotonic) in ``epoch``."""

    def not_live(self) -> None:
        """Changes may not reach this process any more."""


_subscriber: Subscriber | None = None


def attach(subscriber: Subscriber | None) -> None:
    """Set who is told about changes and liveness (the app attaches the definition cache)."""
    global _subscriber
    _subscriber = subscriber


class _Silent(Exception):
    """Redis has answered nothing for too long on a connection that raised no error."""


def _origin_id() -> str:
    """This process's sender id (fork-aware): its own messages are already applied locally."""
    global _origin
    if _origin is None or _origin[0] != os.getpid():
        _origin = (os.getpid(), uuid.uuid4().hex)
    return _origin[1]


def _redis_url() -> str:
    from leases.conf import lease_settings

    return lease_settings.REDIS_URL


def bound_seconds() -> float:
    """The liveness bound: how old the last proof may be while the cache still serves."""
    from leases.conf import lease_settings

    return int(lease_settings.INVALIDATION_LIVENESS_MS) / 1000.0


def _client(timeout: float) -> redis.Redis:
    # No retries: redis-py's default retries would multiply every timeout below.
    return redis.Redis.from_url(_redis_url(), socket_connect_timeout=timeout, socket_timeout=timeout,
                                health_check_interval=0, retry=Retry(NoBackoff(), 0))


def channel() -> str:
    """The pub/sub channel of this database (tests use distinct databases)."""
    return f"leases:config:{store.database_name()}"


def _apply(message: dict) -> None:
    if _subscriber is not None:
        _subscriber.invalidate(message.get("tenantId"), message.get("projectId"), message.get("name"))


def _from_elsewhere(change: dict, origin: str) -> bool:
    """Whether ``change`` came from another process than the one with sender id ``origin``.

    Our own change was applied when it was published; applying it again on its way back
    would only drop entries cached since.
    """
    return change.get("origin") != origin


def _prove(sent_at: float, bound: float) -> None:
    """Record that everything Redis took before ``sent_at`` has reached this process."""
    global _state
    epoch, proof = _state
    lapsed = proof is None or time.monotonic() - proof >= bound
    if lapsed:
        epoch += 1
    fresh = sent_at if proof is None or sent_at > proof else proof
    _state = (epoch, fresh)
    if _subscriber is not None:
        if lapsed:
            # The cache stopped serving meanwhile; what it holds may have missed a change.
            _subscriber.clear()
        _subscriber.live_until(epoch, fresh + bound)
    with _proved:
        _proved.notify_all()


def _lost() -> None:
    global _state
    _state = (_state[0] + 1, None)
    if _subscriber is not None:
        _subscriber.not_live()


def _ping_time(data: Any) -> float | None:
    try:
        return float(data.decode() if isinstance(data, bytes) else data)
    except (TypeError, ValueError, AttributeError):
        return None


def _listen(pubsub: redis.client.PubSub, channel_name: str, bound: float) -> None:
    """Serve one connection until it fails, falls silent, or the thread is stopped.

    Raises:
        redis.RedisError: the connection failed.
        _Silent: nothing came back for twice the bound.
    """
    probe_every = bound / 4
    subscribe_sent = time.monotonic()
    pubsub.subscribe(channel_name)
    subscribed = False
    heard = subscribe_sent
    next_probe = subscribe_sent + probe_every
    while not _stop.is_set():
        now = time.monotonic()
        if now - heard > 2 * bound:
            raise _Silent(f"no answer from Redis for {now - heard:.1f} s")
        if subscribed and now >= next_probe:
            pubsub.ping(repr(now))
            next_probe = now + probe_every
        message = pubsub.get_message(timeout=max(0.01, next_probe - time.monotonic()))
        if message is None:
            continue
        heard = time.monotonic()
        kind = message["type"]
        if kind == "subscribe":
            subscribed = True
            _prove(subscribe_sent, bound)
        elif kind == "pong":
            sent_at = _ping_time(message["data"])
            if sent_at is not None and sent_at <= heard:
                _prove(sent_at, bound)
        elif kind == "message":
            try:
                change = json.loads(message["data"])
                if _from_elsewhere(change, _origin_id()):
                    _apply(change)
            except (ValueError, TypeError, AttributeError):
                if _subscriber is not None:
                    _subscriber.clear()


def _run(channel_name: str) -> None:
    backoff = 0.2
    while not _stop.is_set():
        bound = bound_seconds()
        conn = None
        try:
            conn = _client(bound)
            _listen(conn.pubsub(ignore_subscribe_messages=False), channel_name, bound)
            backoff = 0.2
        except (redis.RedisError, _Silent) as exc:
            log.warning("config invalidation channel lost (%s); caching paused", exc)
        finally:
            _lost()
            if conn is not None:
                try:
                    conn.close()
                except redis.RedisError:
                    pass
        _stop.wait(backoff)
        backoff = min(backoff * 2, 5.0)


def start() -> None:
    """Start this process's listener thread if it is not running (idempotent, fork-aware)."""
    global _thread, _thread_pid
    pid = os.getpid()
    if _thread is not None and _thread_pid == pid and _thread.is_alive():
        return
    with _lock:
        if _thread is not None and _thread_pid == pid and _thread.is_alive():
            return
        if _thread_pid != pid:
            # A forked child inherits the parent's proof but not the thread that earned it.
            _lost()
        _stop.clear()
        _thread = threading.Thread(target=_run, args=(channel(),), name="lease-config-invalidation", daemon=True)
        _thread_pid = pid
        _thread.start()


def _live_epoch() -> int | None:
    epoch, proof = _state
    if proof is None or time.monotonic() - proof >= bound_seconds():
        return None
    return epoch


def listening() -> bool:
    """True while changes from other processes are known to reach this one."""
    return _live_epoch() is not None


def wait_listening(timeout: float = 5.0) -> bool:
    """Start the subscription (if need be) and block until it has proven itself live (start-up, tests)."""
    start()
    with _proved:
        return _proved.wait_for(lambda: _live_epoch() is not None, timeout)


def caught_up(timeout: float = 5.0) -> bool:
    """Block until everything Redis took before this call has been applied here.

    True once a ping sent after this call was answered on the subscription (answers come
    in order with the published messages); False after ``timeout`` or without a running
    subscription.
    """
    since = time.monotonic()
    with _proved:
        return _proved.wait_for(lambda: _state[1] is not None and _state[1] >= since, timeout)


def publish(tenant_id: str | None, project_id: str | None, name: str | None) -> None:
    """Tell every process (this one included, directly) that a definition changed.

    A publish that fails is logged, not raised: the document is already stored. It waits
    at most the liveness bound (connect and answer, half each, no retries): a Redis that
    is frozen or cut off for every process makes each of them stop serving cached entries
    within the bound anyway, so waiting longer would only stall the writer. (A writer cut
    off from a Redis that the others still reach cannot tell them; they keep their entries
    up to ``LEASES_DEFINITION_CACHE_SECONDS``. A lowered cap binds them at once all the
    same: the writer stamps it onto the counters first, :mod:`leases.definitions.caps`.)
    """
    _apply({"tenantId": tenant_id, "projectId": project_id, "name": name})
    try:
        conn = _client(bound_seconds() / 2)
        try:
            conn.publish(channel(), json.dumps({"tenantId": tenant_id, "projectId": project_id, "name": name,
                                                "origin": _origin_id()}))
        finally:
            conn.close()
    except redis.RedisError as exc:
        log.error("could not publish config change for %s: %s", name, exc)
