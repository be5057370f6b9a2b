"""gunicorn settings of the example project: ``gunicorn -c config/gunicorn.conf.py config.wsgi:application``.

Only the Prometheus bookkeeping of multiprocess mode lives here (everything else comes from
the command line). With ``PROMETHEUS_MULTIPROC_DIR`` set by the start-up script, every worker
writes its metrics to files of its own pid in that directory and ``/metrics`` adds them all
up, whichever worker answers; a worker that exits (recycled, crashed, killed by the master's
timeout) must hand back its live gauges, or a request it had waiting would be counted as
waiting forever. See :mod:`leases.telemetry.multiprocess`.
"""

from __future__ import annotations

import os
from typing import Any

# prometheus_client only: the master must not import Django or the lease engine.
from prometheus_client import multiprocess


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn server hook, in the master after a worker exited: drop its live-gauge files."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(worker.pid)
