"""The promises, decided from the clients' history alone (pure functions, no store reads).

**Proven overlap ≤ cap.** A grant is *proven held* from its acquire's completion to the
invocation of the last successful check of its token: the server granted it before the
client heard so, and a check that succeeds later finds it still held (a lease past its
deadline is never renewed), so it was held throughout. An acquire whose completion is
unknown (``kill -9`` in flight), or that ended ``unavailable``, is never proven held, nor is
a grant without a successful check (its hold may have ended before the client heard of it).
At no instant may more grants be proven held than a level's cap, per scope: ``global`` one
scope, ``tenant`` per tenant, ``project`` per tenant/project, ``user`` per tenant/user (the
engine's user scope crosses projects).

**No revival.** Once a check of a token raised ``LeaseLost``, no later check of that token
(invoked after that completion) succeeds.

**Liveness.** A process is *live* at an instant if it was not SIGSTOPped (holder or waiter
stop, or its own stall) and not killed then; global faults (the store server stopped,
Redis down) do not excuse anything, the bounds cover them:

* a ``LeaseBusy`` answered to an acquire whose ``waitMs`` ≥ the bound (longest injected
  fault + TTL + slack) is a violation when the waiter was live for the whole call, or when
  the live part of its wait (the call's duration minus the waiter's own stopped time) still
  reached the bound: either way it waited, live, through every fault, so a slot had to come
  (a waiter stopped past the ticket TTL loses its place and queues again: the bound covers
  that wait too);
* every live process is granted at least once per window of ``W`` seconds of its live
  time: from its start line to its first grant, between two grants, and from its last
  grant to its kill or the end of the run, the time minus its own stopped time is ≤ ``W``.

A Redis stopped for long (``redis-stop``, minutes in the bench) is not in the bound's
longest fault: waiters poll the store without it, so it makes the engine slower, never
stuck; counting it would make the bound longer than any wait and the busy rule vacuous.

**No loss without a cause.** A lease that its live holder renewed less than a TTL ago is
not lost unless something could end it: a check that raises ``LeaseLost`` is a violation
when it was invoked less than ``ttl_s`` after the invocation of the previous successful
check of its token (or less than ``ttl_s - GRANT_MARGIN_S`` after the acquire's
completion: a direct grant is stamped when it is made, up to a claim window before the
waiter hears of it), and no store fault (``store-stop``, ``reply-lost``) and no stop or
kill of that process overlaps the interval (for a first check, from the acquire's
invocation: a waiter stopped while it waited may be granted while it cannot claim). A slot handed over as a lease that is already
dead (a waiter whose holder was reaped while it waited past the TTL) is one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tests.checker.history import Call, Fault, History

#: Faults during which the *target* process is not live (a kill is for good).
STOPPING_FAULTS = frozenset({"holder-stop", "waiter-stop", "client-stop", "stall", "kill", "http-vanish"})
#: Global faults that may end a lease a live holder renews (its renewals cannot land).
STORE_FAULTS = frozenset({"store-stop", "reply-lost"})
#: Outages the engine works through without waiting for their end (see the module docstring).
UNBOUNDED_FAULTS = frozenset({"redis-stop"})
#: How long before its acquire's completion a grant may have been stamped (the claim window, and slack).
GRANT_MARGIN_S = 1.0


@dataclass(frozen=True)
class Grant:
    """A grant proven held on ``[start, end]`` (acquire completion → last successful check)."""

    process: str
    token: str
    tenant: str
    project: str
    user: str
    start: float
    end: float

    def scope(self, level: str) -> str:
        """This grant's scope key at ``level`` (the engine's: user scope is tenant/user)."""
        return {"global": "*", "tenant": self.tenant, "project": f"{self.tenant}/{self.project}",
                "user": f"{self.tenant}/{self.user}"}[level]

    def __str__(self) -> str:
        return f"{self.process}:{self.token[:10]} [{self.start:.3f}, {self.end:.3f}]"


@dataclass(frozen=True)
class Overlap:
    """More grants proven held at instant ``at`` than ``cap`` at ``level``/``scope``."""

    level: str
    scope: str
    cap: int
    count: int
    at: float
    grants: tuple[Grant, ...]

    def __str__(self) -> str:
        held = ", ".join(str(g) for g in self.grants)
        return f"overlap {self.count} > cap {self.cap} at {self.level} {self.scope!r} at t={self.at:.3f}: {held}"


@dataclass(frozen=True)
class Revival:
    """A successful check of ``token`` invoked after a check of it raised ``LeaseLost``."""

    process: str
    token: str
    lost_at: float
    revived: Call

    def __str__(self) -> str:
        return (f"revival of {self.process}:{self.token[:10]}: LeaseLost completed at t={self.lost_at:.3f}, "
                f"check #{self.revived.seq} invoked at t={self.revived.invoked:.3f} succeeded")


@dataclass(frozen=True)
class LivenessViolation:
    """A live waiter told busy within its covering bound, or a live process not granted for ``W``."""

    process: str
    kind: str  # "busy" | "starved"
    start: float
    end: float
    detail: str

    def __str__(self) -> str:
        return f"liveness ({self.kind}) of {self.process} on [{self.start:.3f}, {self.end:.3f}]: {self.detail}"


def proven_grants(history: History) -> list[Grant]:
    """Every grant with a proven-held interval (see the module docstring)."""
    grants = []
    for process in {c.process for c in history.calls}:
        calls = history.of(process)
        for index, call in enumerate(calls):
            if call.op != "acquire" or call.outcome != "ok" or call.completed is None or not call.token:
                continue
            checks = [c.invoked for c in calls[index + 1:]
                      if c.op == "check" and c.token == call.token and c.outcome == "ok" and c.completed is not None]
            if checks:
                grants.append(Grant(process, call.token, call.tenant, call.project, call.user,
                                    call.completed, max(checks)))
    return grants


def _sweep(grants: list[Grant]) -> list[tuple[float, list[Grant]]]:
    """``(instant, grants held from it)`` at each start, ends first at a tie (a hand-over)."""
    events = sorted([(g.start, 1, i) for i, g in enumerate(grants)] + [(g.end, 0, i) for i, g in enumerate(grants)])
    active: set[int] = set()
    states = []
    for at, is_start, index in events:
        if is_start:
            active.add(index)
            states.append((at, [grants[i] for i in sorted(active)]))
        else:
            active.discard(index)
    return states


def overlaps(grants: list[Grant], caps: dict[str, int]) -> list[Overlap]:
    """Each instant a grant's start makes more grants proven held than a cap, per level and scope."""
    found = []
    for level, cap in caps.items():
        by_scope: dict[str, list[Grant]] = defaultdict(list)
        for grant in grants:
            by_scope[grant.scope(level)].append(grant)
        for scope, scoped in sorted(by_scope.items()):
            for at, held in _sweep(scoped):
                if len(held) > cap:
                    found.append(Overlap(level, scope, cap, len(held), at, tuple(held)))
    return found


def max_overlap(grants: list[Grant], caps: dict[str, int]) -> dict[str, tuple[int, str]]:
    """The most grants proven held at once per level: ``{level: (count, scope)}``."""
    result = {}
    for level in caps:
        best = (0, "")
        by_scope: dict[str, list[Grant]] = defaultdict(list)
        for grant in grants:
            by_scope[grant.scope(level)].append(grant)
        for scope, scoped in by_scope.items():
            for _, held in _sweep(scoped):
                best = max(best, (len(held), scope))
        result[level] = best
    return result


def revivals(history: History) -> list[Revival]:
    """Every successful check invoked after a ``LeaseLost`` of the same token had completed."""
    found = []
    lost_at: dict[str, float] = {}
    for call in sorted((c for c in history.calls if c.op == "check" and c.token), key=lambda c: c.invoked):
        token = call.token or ""
        if call.outcome == "lost" and call.completed is not None:
            lost_at.setdefault(token, call.completed)
        elif call.outcome == "ok" and token in lost_at and call.invoked > lost_at[token]:
            found.append(Revival(call.process, token, lost_at[token], call))
    return found


def stopped(history: History, process: str) -> list[tuple[float, float]]:
    """The windows in which ``process`` was not live (its stops, its kill: to infinity)."""
    return sorted((f.start, f.end if f.end is not None else float("inf"))
                  for f in history.faults if f.target == process and f.kind in STOPPING_FAULTS)


def _stopped_within(windows: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in windows)


def longest_fault(faults: list[Fault]) -> float:
    """The longest window of an injected fault that ends (a kill's replacement starts anew),
    but for :data:`UNBOUNDED_FAULTS`."""
    return max((f.duration() or 0.0 for f in faults if f.kind not in UNBOUNDED_FAULTS), default=0.0)


@dataclass(frozen=True)
class Loss:
    """A ``LeaseLost`` of ``token`` that nothing explains (see the module docstring)."""

    process: str
    token: str
    since: float  # the last successful call of the token (invocation of a check, completion of the grant)
    lost: Call

    def __str__(self) -> str:
        return (f"loss of {self.process}:{self.token[:10]} without a cause: check #{self.lost.seq} invoked at "
                f"t={self.lost.invoked:.3f}, {self.lost.invoked - self.since:.2f}s after its last success "
                f"at t={self.since:.3f} ({self.lost.detail})")


def losses(history: History, *, ttl_s: float) -> list[Loss]:
    """Every first ``LeaseLost`` of a token that a recent renewal and no fault leave unexplained."""
    found = []
    for process in sorted({c.process for c in history.calls}):
        excused = stopped(history, process) + [
            (f.start, f.end if f.end is not None else float("inf")) for f in history.faults if f.kind in STORE_FAULTS]
        # token -> (last success, its validity in s, where an excusing fault may start)
        since: dict[str, tuple[float, float, float]] = {}
        done: set[str] = set()
        for call in history.of(process):
            token = call.token or ""
            if not token or token in done:
                continue
            if call.op == "acquire" and call.outcome == "ok" and call.completed is not None:
                # A waiter stopped during its wait may have been granted while it could not claim.
                since[token] = (call.completed, ttl_s - GRANT_MARGIN_S, call.invoked)
            elif call.op == "check" and call.outcome == "ok" and token in since:
                since[token] = (call.invoked, ttl_s, call.invoked)
            elif call.op == "check" and call.outcome == "lost" and call.completed is not None and token in since:
                done.add(token)
                at, valid, from_ = since[token]
                if call.invoked - at < valid and _stopped_within(excused, from_, call.completed) == 0:
                    found.append(Loss(process, token, at, call))
    return found


def process_end(history: History, process: str) -> float:
    """When ``process`` stopped being observed: its kill, else the end of the run, else its last line."""
    kills = [f.start for f in history.faults if f.target == process and f.kind == "kill"]
    if kills:
        return min(kills)
    if history.ended is not None:
        return history.ended
    return max((c.completed or c.invoked for c in history.calls if c.process == process), default=0.0)


@dataclass
class Liveness:
    """Liveness verdict and figures; ``violations`` empty when it holds."""

    wait_bound_ms: float
    window_s: float
    violations: list[LivenessViolation] = field(default_factory=list)
    grants: dict[str, int] = field(default_factory=dict)
    longest_live_wait_s: float = 0.0
    longest_live_gap_s: float = 0.0
    busy_to_live: int = 0  # busy answers to live waiters whose waitMs covered the faults


def liveness(history: History, *, ttl_s: float, slack_s: float, window_s: float) -> Liveness:
    """Decide liveness (see the module docstring) with ``W = window_s``.

    The covering wait bound is ``longest injected fault + ttl_s + slack_s``.
    """
    bound_ms = (longest_fault(history.faults) + ttl_s + slack_s) * 1000
    verdict = Liveness(wait_bound_ms=bound_ms, window_s=window_s)
    for process, started in sorted(history.starts.items()):
        windows = stopped(history, process)
        calls = history.of(process)
        grants_at = []
        for call in calls:
            if call.op != "acquire" or call.completed is None:
                continue
            live_wait = (call.completed - call.invoked) - _stopped_within(windows, call.invoked, call.completed)
            live = live_wait == call.completed - call.invoked
            if live:
                verdict.longest_live_wait_s = max(verdict.longest_live_wait_s, call.completed - call.invoked)
            if call.outcome == "ok":
                grants_at.append(call.completed)
            elif call.outcome == "busy" and (call.wait_ms or 0) >= bound_ms and (live or live_wait * 1000 >= bound_ms):
                verdict.busy_to_live += 1
                verdict.violations.append(LivenessViolation(
                    process, "busy", call.invoked, call.completed,
                    f"LeaseBusy at level {call.level} (position {call.position}) after "
                    f"{call.completed - call.invoked:.2f}s ({live_wait:.2f}s of it live) with waitMs "
                    f"{call.wait_ms} >= bound {bound_ms:.0f} ms "
                    f"({call.detail})"))
        verdict.grants[process] = len(grants_at)
        end = process_end(history, process)
        points = [started, *sorted(grants_at), max(end, started)]
        for a, b in zip(points, points[1:]):
            gap = (b - a) - _stopped_within(windows, a, b)
            verdict.longest_live_gap_s = max(verdict.longest_live_gap_s, gap)
            if gap > window_s:
                others = {p: n for p, n in sorted(_grants_between(history, a, b).items()) if p != process}
                verdict.violations.append(LivenessViolation(
                    process, "starved", a, b,
                    f"no grant for {gap:.2f}s of live time (W = {window_s}s) while the others were granted "
                    f"{sum(others.values())} times {others}"))
    return verdict


def _grants_between(history: History, start: float, end: float) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for call in history.calls:
        if call.op == "acquire" and call.outcome == "ok" and call.completed is not None and start < call.completed < end:
            counts[call.process] += 1
    return counts


@dataclass
class Verdict:
    """Everything :func:`check` decided: the violations of each promise and the figures."""

    grants: list[Grant]
    overlaps: list[Overlap]
    revivals: list[Revival]
    liveness: Liveness
    max_overlap: dict[str, tuple[int, str]]
    losses: list[Loss] = field(default_factory=list)

    @property
    def violations(self) -> list[str]:
        return [str(v) for v in (*self.overlaps, *self.revivals, *self.liveness.violations, *self.losses)]


def check(history: History, caps: dict[str, int], *, ttl_s: float, slack_s: float, window_s: float) -> Verdict:
    """Every promise over ``history`` with the definition's ``caps`` (level -> cap)."""
    grants = proven_grants(history)
    return Verdict(grants=grants, overlaps=overlaps(grants, caps), revivals=revivals(history),
                   liveness=liveness(history, ttl_s=ttl_s, slack_s=slack_s, window_s=window_s),
                   max_overlap=max_overlap(grants, caps), losses=losses(history, ttl_s=ttl_s))
