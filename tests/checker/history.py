"""What the clients were told: the per-process recorder and the merged history.

Each client process appends JSON lines to a file of its own, one line when a call is
invoked and one when it completes, each stamped with ``time.monotonic()`` (CLOCK_MONOTONIC,
one clock for the whole machine on Linux, so times compare across processes). Every line is
flushed as it is written: a ``kill -9`` loses at most the completion of the call in flight,
and a call whose completion is missing is *indeterminate* (``completed is None``).

Line shapes::

    {"p": "t1-a.0", "n": 3, "ev": "invoke", "op": "acquire", "at": 812.51, "lease": "pauses",
     "tenant": "t1", "project": "p1", "user": "u1", "waitMs": 15000}
    {"p": "t1-a.0", "n": 3, "ev": "complete", "at": 813.02, "outcome": "ok", "token": "..."}
    {"p": "t1-a.0", "n": 4, "ev": "invoke", "op": "check", "at": 813.10, "token": "..."}
    {"p": "t1-a.0", "n": 4, "ev": "complete", "at": 813.11, "outcome": "lost", "detail": "..."}

``op`` is ``acquire``, ``check``, ``release``, ``stall`` (the stop-the-world pause between a
successful check and the use) or ``use``; ``outcome`` is ``ok``, ``busy`` (with ``level`` and
``position``), ``lost``, ``unavailable`` or ``error``. A ``start`` line opens each file.

Fault windows (written by the injector in the test process) are JSON lines too::

    {"kind": "holder-stop", "target": "t2-b.0", "start": 820.0, "end": 823.1}

``end`` is null for a ``kill`` (the process never comes back; a replacement gets a new name).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

FAULTS_FILE = "faults.jsonl"
CLIENT_SUFFIX = ".history.jsonl"

OUTCOMES = frozenset({"ok", "busy", "lost", "unavailable", "error"})


class Recorder:
    """Appends one process's invocations and completions to ``<dir>/<name>.history.jsonl``."""

    def __init__(self, directory: str, name: str) -> None:
        self.name = name
        self._seq = 0
        self._file = open(os.path.join(directory, name + CLIENT_SUFFIX), "a", encoding="utf-8")  # noqa: SIM115
        self._write({"ev": "start", "at": time.monotonic(), "pid": os.getpid()})

    def _write(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps({"p": self.name, **line}) + "\n")
        self._file.flush()  # in the OS's hands now: a kill -9 of this process cannot lose it

    def invoke(self, op: str, **fields: Any) -> int:
        """Record the invocation of ``op`` now; returns the call's number for :meth:`complete`."""
        self._seq += 1
        self._write({"n": self._seq, "ev": "invoke", "op": op, "at": time.monotonic(), **fields})
        return self._seq

    def complete(self, call: int, outcome: str, **fields: Any) -> None:
        """Record the completion of call ``call`` now with ``outcome`` (one of :data:`OUTCOMES`)."""
        self._write({"n": call, "ev": "complete", "at": time.monotonic(), "outcome": outcome, **fields})

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class Call:
    """One call of one process: invoked at ``invoked``; ``completed``/``outcome`` None when unknown."""

    process: str
    seq: int
    op: str
    invoked: float
    completed: float | None = None
    outcome: str | None = None
    token: str | None = None
    tenant: str = ""
    project: str = ""
    user: str = ""
    wait_ms: int | None = None
    level: str | None = None
    position: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class Fault:
    """A fault window on ``target`` (a process name, ``store`` or ``redis``); ``end`` None: for good."""

    kind: str
    target: str
    start: float
    end: float | None

    def duration(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass
class History:
    """The merged history of a run: calls per process, process spans, fault windows."""

    calls: list[Call] = field(default_factory=list)
    starts: dict[str, float] = field(default_factory=dict)  # process -> its start line
    faults: list[Fault] = field(default_factory=list)
    ended: float | None = None  # when the run told its processes to stop (liveness ends there)

    def of(self, process: str) -> list[Call]:
        """The calls of ``process`` in the order it made them."""
        return sorted((c for c in self.calls if c.process == process), key=lambda c: c.seq)

    def only(self, prefix: str) -> History:
        """The processes whose names start with ``prefix`` (one group: one lease definition),
        with every fault window (a global fault concerns every group)."""
        return History(calls=[c for c in self.calls if c.process.startswith(prefix)],
                       starts={p: at for p, at in self.starts.items() if p.startswith(prefix)},
                       faults=list(self.faults), ended=self.ended)


def calls_from_lines(lines: list[dict[str, Any]]) -> tuple[list[Call], dict[str, float]]:
    """Pair invocation and completion lines (by process and call number) into :class:`Call`.

    Returns:
        ``(calls, starts)``; a call without a completion line is indeterminate.
    """
    invocations: dict[tuple[str, int], dict[str, Any]] = {}
    completions: dict[tuple[str, int], dict[str, Any]] = {}
    starts: dict[str, float] = {}
    for line in lines:
        if line["ev"] == "start":
            starts[line["p"]] = line["at"]
        elif line["ev"] == "invoke":
            invocations[(line["p"], line["n"])] = line
        elif line["ev"] == "complete":
            completions[(line["p"], line["n"])] = line
    calls = []
    for key, inv in invocations.items():
        done = completions.get(key, {})
        calls.append(Call(
            process=key[0], seq=key[1], op=inv["op"], invoked=inv["at"], completed=done.get("at"),
            outcome=done.get("outcome"), token=done.get("token") or inv.get("token"),
            tenant=inv.get("tenant", ""), project=inv.get("project", ""), user=inv.get("user", ""),
            wait_ms=inv.get("waitMs"), level=done.get("level"), position=done.get("position"),
            detail=done.get("detail", "")))
    return calls, starts


def _read_lines(path: str) -> list[dict[str, Any]]:
    lines = []
    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            if raw.endswith("\n"):  # a line cut by kill -9 mid-write is the call in flight
                lines.append(json.loads(raw))
    return lines


def load(directory: str, ended: float | None = None) -> History:
    """Merge every client file and the fault file of ``directory`` into one :class:`History`."""
    lines: list[dict[str, Any]] = []
    faults: list[Fault] = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.endswith(CLIENT_SUFFIX):
            lines.extend(_read_lines(path))
        elif name == FAULTS_FILE:
            faults = [Fault(f["kind"], f["target"], f["start"], f["end"]) for f in _read_lines(path)]
    calls, starts = calls_from_lines(lines)
    return History(calls=calls, starts=starts, faults=faults, ended=ended)
