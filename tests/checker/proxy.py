"""A TCP proxy between the client processes and the store that can lose a write's answer.

The fault it injects is the one a timeout after the server wrote produces: the command
reaches the server and is applied, its reply never reaches the client. The proxy forwards
every message unchanged; while a burst is armed (:meth:`ReplyDropper.arm`), a write
command (``insert``, ``update``, ``delete``, ``findAndModify``, ``bulkWrite``) is picked
with the burst's probability, forwarded, and its reply is swallowed and the client's
connection closed, so the driver sees a network error for a command the server applied.
Reads, handshakes and heartbeats always get their answers, so the client can look at what
happened (the engine's own recovery path).

The command name is read from the wire (OP_MSG, opcode 2013: a 16-byte header, 4 bytes of
flagBits, then section kind 0 whose BSON document's first key is the command's name); a
reply is matched to its request by ``responseTo``. Only 127.0.0.1; threads, one pair per
connection, all daemon threads that end with their sockets.

Retries: the engine's client asks for ``retryWrites``, but pymongo sends a write as
retryable (``txnNumber`` in the command) only to a replica set or a sharded cluster, never
to a standalone server; the embedded SecantusDB runs standalone here (a replica-set URI
would discover the server's own address and bypass the proxy), so no dropped write is
retried by the driver: the engine gets the error (``AutoReconnect``) at once. The proxy
counts dropped commands that carried a ``txnNumber`` and requests that repeat a dropped
one's ``(lsid, txnNumber)``, so a run says which happened (:attr:`ReplyDropper.stats`).
SecantusDB as a single-node replica set does get ``txnNumber`` from pymongo, and answers an
``insert`` repeated under one ``(lsid, txnNumber)`` as applied once (``n: 1`` both times,
one document), so the retry a replica set gets is safe.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import bson

OP_MSG = 2013
HEADER = struct.Struct("<iiii")  # messageLength, requestID, responseTo, opCode
WRITE_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify", "findandmodify", "bulkWrite"})
MAX_MESSAGE = 64 * 1024 * 1024


def command_of(message: bytes) -> str | None:
    """The command name of an OP_MSG ``message`` (whole, header included); None for other opcodes."""
    if len(message) < 22 or HEADER.unpack_from(message)[3] != OP_MSG or message[20] != 0:
        return None
    # The body document starts at 21: int32 length, then the first element: type byte, cstring key.
    end = message.find(b"\x00", 26)
    return message[26:end].decode("utf-8", "replace") if end > 26 else None


def body_of(message: bytes) -> dict[str, Any]:
    """The section-0 document of an OP_MSG ``message`` (decoded; only for the few dropped ones)."""
    (length,) = struct.unpack_from("<i", message, 21)
    return bson.decode(message[21:21 + length])


def _read_message(sock: socket.socket) -> bytes | None:
    """One whole wire message from ``sock``; None when the peer closed."""
    header = _read_exact(sock, 16)
    if header is None:
        return None
    length = HEADER.unpack_from(header)[0]
    if not 16 <= length <= MAX_MESSAGE:
        return None
    rest = _read_exact(sock, length - 16)
    return None if rest is None else header + rest


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        try:
            chunk = sock.recv(n - got)
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


@dataclass
class DropStats:
    """What the proxy did: forwarded writes, swallowed replies, and what the driver did about it."""

    connections: int = 0
    writes: int = 0  # write commands forwarded
    dropped: int = 0  # replies swallowed (the command was forwarded first)
    dropped_by_command: dict[str, int] = field(default_factory=dict)
    retryable: int = 0  # dropped commands that carried a txnNumber
    retried: int = 0  # later requests repeating a dropped one's (lsid, txnNumber)


class ReplyDropper:
    """The proxy: listens on 127.0.0.1 (a free port), forwards to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int], *, seed: int = 0) -> None:
        self.upstream = upstream
        self.stats = DropStats()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._until = 0.0
        self._rate = 0.0
        self._dropped_txns: set[tuple[bytes, int]] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name="reply-dropper", daemon=True).start()

    @property
    def uri(self) -> str:
        """The URI the clients use instead of the server's (a direct connection to the proxy)."""
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def arm(self, seconds: float, rate: float) -> None:
        """Drop each write's reply with probability ``rate`` for the next ``seconds``."""
        with self._lock:
            self._until = time.monotonic() + seconds
            self._rate = rate

    def _pick(self, command: str | None) -> bool:
        if command not in WRITE_COMMANDS:
            return False
        with self._lock:
            self.stats.writes += 1
            return time.monotonic() < self._until and self._rng.random() < self._rate

    def close(self) -> None:
        """Stop listening and cut every open connection."""
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.stats.connections += 1
                self._open.update((client, server))
            swallow: set[int] = set()
            threading.Thread(target=self._requests, args=(client, server, swallow), daemon=True).start()
            threading.Thread(target=self._replies, args=(client, server, swallow), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket, swallow: set[int]) -> None:
        """Client to server: whole messages, forwarded; a picked write's request id is noted first."""
        try:
            while (message := _read_message(client)) is not None:
                command = command_of(message)
                if command in WRITE_COMMANDS and self._dropped_txns:
                    self._note_retry(message)
                if self._pick(command):
                    swallow.add(HEADER.unpack_from(message)[1])
                    self._note_drop(command or "", message)
                server.sendall(message)
        except OSError:
            pass
        finally:
            self._end(client, server)

    def _replies(self, client: socket.socket, server: socket.socket, swallow: set[int]) -> None:
        """Server to client: whole messages; the reply to a picked write ends the connection unsent."""
        try:
            while (message := _read_message(server)) is not None:
                if HEADER.unpack_from(message)[2] in swallow:
                    with self._lock:
                        self.stats.dropped += 1
                    return  # applied by the server, never answered: the client sees the connection drop
                client.sendall(message)
        except OSError:
            pass
        finally:
            self._end(client, server)

    def _note_drop(self, command: str, message: bytes) -> None:
        body = body_of(message)
        with self._lock:
            self.stats.dropped_by_command[command] = self.stats.dropped_by_command.get(command, 0) + 1
            if "txnNumber" in body:
                self.stats.retryable += 1
                self._dropped_txns.add((bson.encode(body.get("lsid") or {}), int(body["txnNumber"])))

    def _note_retry(self, message: bytes) -> None:
        body = body_of(message)
        if "txnNumber" in body and (bson.encode(body.get("lsid") or {}), int(body["txnNumber"])) in self._dropped_txns:
            with self._lock:
                self.stats.retried += 1

    def _end(self, client: socket.socket, server: socket.socket) -> None:
        with self._lock:
            self._open.discard(client)
            self._open.discard(server)
        _close(client)
        _close(server)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
