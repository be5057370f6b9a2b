"""A Jepsen-style history checker for leases: judged from what the clients were told.

* :mod:`tests.checker.history` — the per-process recorder (JSON lines, one per invocation
  and one per completion, flushed per event) and the loader that merges the files.
* :mod:`tests.checker.rules` — pure functions over the merged history: proven overlap ≤ cap
  per level and scope, no revival after ``LeaseLost``, liveness, no loss without a cause.
  No store reads.
* :mod:`tests.checker.slots` — "every slot comes back", the one promise read from the store:
  the counters during the run, and after it a sweep and the audit.
* :mod:`tests.checker.faults` — the fault injector of the test process (SIGSTOP of holders,
  waiters and the store server, ``kill -9``, a private Redis killed and restarted or
  stopped, a stop-the-world stall between a successful check and the use, lost write
  replies, long holds, HTTP tickets left behind).
* :mod:`tests.checker.proxy` — the TCP proxy between clients and store that loses the reply
  of a write the server applied.
* :mod:`tests.checker.harness` — one run: real client processes
  (``tests.workers.history_client``), the faults, the merged history.
"""
