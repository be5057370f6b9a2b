"""A Jepsen-style history checker for leases: judged from what the clients were told.

* :mod:`tests.checker.history` — the per-process recorder (JSON lines, one per invocation
  and one per completion, flushed per event) and the loader that merges the files.
* :mod:`tests.checker.rules` — pure functions over the merged history: proven overlap ≤ cap
  per level and scope, no revival after ``LeaseLost``, liveness. No store reads.
* :mod:`tests.checker.faults` — the fault injector of the test process (SIGSTOP of holders,
  waiters and the store server, ``kill -9``, a private Redis killed and restarted, a
  stop-the-world stall between a successful check and the use).
* :mod:`tests.checker.harness` — one run: real client processes
  (``tests.workers.history_client``), the faults, the merged history.
"""
