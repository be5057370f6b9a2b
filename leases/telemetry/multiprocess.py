"""Every process's lease metrics in one scrape: prometheus_client's multiprocess mode.

Lease metrics are counted where the work happens: grants in web processes and in the Celery
pool children that run ``@leased`` tasks, reaps and reconcile corrections in the child that
runs beat's sweep. Each process keeps its own registry, so a scrape of one web process sees
only that process's share (and a gunicorn master's port answers from whichever worker took
the connection). prometheus_client's documented answer is multiprocess mode, chosen here:

* the start-up script of a host (one PID namespace: a machine, a container) wipes one
  directory and sets ``PROMETHEUS_MULTIPROC_DIR`` to it in the environment of *every*
  process it starts (web workers, Celery worker, beat) — the environment, not Python code,
  because prometheus_client picks the mode when it is first imported and forked children
  inherit it (:func:`prepare` does the wiping);
* every process then writes its samples to files of its own pid there, and django-prometheus'
  ``/metrics`` view (``django_prometheus.urls``) adds up all files of the directory;
* a process that ends hands back its live-gauge files (:func:`mark_dead`): Celery pool
  children on ``worker_process_shutdown`` (:mod:`leases.upkeep.tasks`), gunicorn workers through
  the ``child_exit`` server hook of the host's gunicorn config. Counter files stay: what a
  dead process counted was counted.

Chosen over one metrics port per process (django-prometheus' ``PROMETHEUS_METRICS_EXPORT_PORT_RANGE``)
because Celery's pool children come and go (``max_tasks_per_child``, a killed child is
replaced), each would need a port and a scrape target of its own, and counts of a replaced
child would vanish from the scrape with it. The price is prometheus_client's documented
limits of the mode (no custom collectors, gauges combine by a declared ``multiprocess_mode``,
no ``_created`` samples) and one directory per PID namespace: pids must be unique among the
processes writing to it, so hosts (pods) never share one. A host that runs no web process
(a worker-only machine) has no ``/metrics`` of its own; see the metrics how-to (docs/how-to/metrics.md).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from prometheus_client import multiprocess

ENV = "PROMETHEUS_MULTIPROC_DIR"
# prometheus_client names a live gauge's file gauge_live<mode>_<pid>.db.
_LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")


def directory() -> str | None:
    """This process's multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``), ``None`` when off."""
    return os.environ.get(ENV) or None


def prepare(path: str | os.PathLike[str]) -> Path:
    """Empty (or create) the directory a host's processes are about to share; returns it.

    Call it once, before the first process of the host starts: prometheus_client requires the
    directory wiped between runs, or the counts of a previous run's pids would be added again.

    Raises:
        OSError: the directory cannot be removed or created.
    """
    target = Path(path)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    return target


def mark_dead(pid: int) -> None:
    """Drop the live-gauge files of process ``pid`` (it ended); nothing when the mode is off."""
    path = directory()
    if path:
        multiprocess.mark_process_dead(pid, path)


def forget_dead_processes() -> list[int]:
    """Mark dead every process of the directory that no longer runs; returns their pids.

    A process killed with SIGKILL runs no shutdown hook, so its live gauges (requests it had
    waiting) would be added up forever. A pool that replaces a child calls this from the new
    child, which fixes the scrape within one replacement.
    """
    path = directory()
    if not path:
        return []
    try:
        names = os.listdir(path)
    except OSError:
        return []
    dead = []
    for pid in sorted({int(m.group(1)) for m in map(_LIVE_GAUGE_FILE.fullmatch, names) if m}):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            dead.append(pid)
            mark_dead(pid)
        except PermissionError:
            pass  # runs, under another user
    return dead
