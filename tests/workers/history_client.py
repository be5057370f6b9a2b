"""Child process: a client loop whose every call is recorded for the history checker.

Usage: python -m tests.workers.history_client <name> <run-dir> <lease> <tenant> <project> <user> <wait-ms> <seed>

Loops until ``<run-dir>/stop`` exists (looked at between cycles): acquire (``leases.acquire``
with a ``LeaseRequest`` on the named definition ``<lease>``, detached: idle reap only), then
``CHECKS`` times: hold a little, ``check()``, the "use"; then release. Every call is recorded
(:class:`tests.checker.history.Recorder`) in ``<run-dir>/<name>.history.jsonl``.

After a ``LeaseLost`` it checks the token once more (the no-revival rule needs a later check
to judge) and releases. After a release that failed (``LeaseUnavailable``: nothing was
released, says its contract) it checks the lease before it tries again (unless
``HISTORY_CHECK_AFTER_FAILED_RELEASE=0``): a lease that passes that check is held, so a slot
the failed release handed on shows as an overlap. A stall is requested by the test creating ``<run-dir>/<name>.stall``:
after the next successful check the process stops itself with SIGSTOP — a stop-the-world
pause between the check and the use — and the test's injector continues it. A long hold
is requested by ``<run-dir>/<name>.hold`` (its text: seconds): after its next successful
check the process keeps the lease that long, checking it every ``LONG_HOLD_CHECK_S`` (each
check renews it), so the others wait longer than the TTL.
"""

import os
import random
import signal
import sys
import time

import django

django.setup()

import leases  # noqa: E402
from leases.definitions import invalidation  # noqa: E402
from leases.revocation import handlers  # noqa: E402
from tests.checker.history import Recorder  # noqa: E402

CHECKS = 3
HOLD_S = (0.03, 0.12)
BUSY_BACKOFF_S = (0.05, 0.15)  # a busy storm only loads the server
UNAVAILABLE_BACKOFF_S = 0.2
# HISTORY_CHECK_AFTER_FAILED_RELEASE=0: retry a failed release without checking the lease first.
CHECK_AFTER_FAILED_RELEASE = os.environ.get("HISTORY_CHECK_AFTER_FAILED_RELEASE", "1") != "0"
LONG_HOLD_CHECK_S = 0.4  # well inside the TTL: the lease is renewed long before its deadline


class QuietHandler(handlers.LeaseHandler):
    type = "history"

    def on_revoked(self, holder):
        pass


def _outcome(exc: BaseException) -> tuple[str, dict]:
    """The recorded outcome of a call that raised ``exc``."""
    detail = f"{type(exc).__name__}: {exc}"[:300]
    if isinstance(exc, leases.LeaseBusy):
        return "busy", {"level": exc.level, "position": exc.position, "detail": detail}
    if isinstance(exc, leases.LeaseLost):
        return "lost", {"detail": detail}
    if isinstance(exc, leases.LeaseUnavailable):
        return "unavailable", {"detail": detail}
    return "error", {"detail": detail}


def _check(recorder: Recorder, lease) -> str:
    call = recorder.invoke("check", token=lease.token)
    try:
        lease.check()
    except Exception as exc:  # noqa: BLE001 - every outcome is recorded, the loop decides
        outcome, fields = _outcome(exc)
        recorder.complete(call, outcome, **fields)
        return outcome
    recorder.complete(call, "ok")
    return "ok"


def _release(recorder: Recorder, lease) -> None:
    for _ in range(3):  # a release that failed in an outage may be retried (its contract)
        call = recorder.invoke("release", token=lease.token)
        try:
            released = lease.release()
        except Exception as exc:  # noqa: BLE001
            outcome, fields = _outcome(exc)
            recorder.complete(call, outcome, **fields)
            time.sleep(UNAVAILABLE_BACKOFF_S)
            # A failed release says nothing was released: the lease is still the client's to
            # use, so it checks it (a slot that went on meanwhile shows as an overlap).
            if CHECK_AFTER_FAILED_RELEASE and _check(recorder, lease) == "lost":
                return
            continue
        recorder.complete(call, "ok", detail=f"released={released}")
        return


def _stall_if_asked(recorder: Recorder, stall_file: str) -> None:
    if os.path.exists(stall_file):
        os.remove(stall_file)
        call = recorder.invoke("stall")
        os.kill(os.getpid(), signal.SIGSTOP)  # every thread stops; the injector sends SIGCONT
        recorder.complete(call, "ok")


def _hold_if_asked(recorder: Recorder, lease, hold_file: str) -> str:
    """Keep the lease for the seconds ``hold_file`` asks, checking it; the last check's outcome."""
    try:
        with open(hold_file) as handle:
            seconds = float(handle.read() or 0)
        os.remove(hold_file)
    except (FileNotFoundError, ValueError):
        return "ok"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(LONG_HOLD_CHECK_S)
        outcome = _check(recorder, lease)
        if outcome != "ok":
            return outcome
    return "ok"


def main() -> None:
    name, run_dir, lease_name, tenant, project, user = sys.argv[1:7]
    wait_ms, seed = int(sys.argv[7]), int(sys.argv[8])
    handlers.register_handler(QuietHandler())
    invalidation.wait_listening()  # a long-running process: definitions come from its cache
    rng = random.Random(seed)
    stop_file, stall_file = os.path.join(run_dir, "stop"), os.path.join(run_dir, name + ".stall")
    hold_file = os.path.join(run_dir, name + ".hold")
    request = leases.LeaseRequest(type="history", lease=lease_name, tenant_id=tenant, project_id=project,
                                  user_id=user, pod="", wait_ms=wait_ms)
    recorder = Recorder(run_dir, name)
    while not os.path.exists(stop_file):
        call = recorder.invoke("acquire", lease=lease_name, tenant=tenant, project=project, user=user,
                               waitMs=wait_ms)
        try:
            lease = leases.acquire(request)
        except Exception as exc:  # noqa: BLE001
            outcome, fields = _outcome(exc)
            recorder.complete(call, outcome, **fields)
            time.sleep(rng.uniform(*BUSY_BACKOFF_S) if outcome == "busy" else UNAVAILABLE_BACKOFF_S)
            continue
        recorder.complete(call, "ok", token=lease.token)
        for _ in range(CHECKS):
            time.sleep(rng.uniform(*HOLD_S))
            outcome = _check(recorder, lease)
            if outcome == "lost":
                _check(recorder, lease)  # stays lost? (the no-revival rule)
                break
            if outcome == "ok":
                outcome = _hold_if_asked(recorder, lease, hold_file)
            if outcome == "lost":
                _check(recorder, lease)
                break
            if outcome != "ok":
                break
            _stall_if_asked(recorder, stall_file)
            use = recorder.invoke("use", token=lease.token)
            recorder.complete(use, "ok")
        _release(recorder, lease)
    recorder.close()


if __name__ == "__main__":
    main()
