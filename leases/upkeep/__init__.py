"""Upkeep: the safety net that runs on a schedule, not on a request.

``reaper`` (reaping holders: idle, dead pod; each reap returns slots and dispatches the
handler), ``sweeps`` (the beat sweep: reap, reconcile counters, prune tickets), ``tasks``
(the Celery task, registered as ``leases.tasks.sweep`` whatever its module) and ``rounds``
(what an operator runs on demand: reconcile until done, a sweep with no handler).

Above the engine (it ends holders through ``leases.engine.holders``); only the operator
layer, the app and the edges import it.
"""
