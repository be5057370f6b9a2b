"""Reference consumers of the lease contract, each an opt-in Django app with its handler.

* :mod:`leases.contrib.jobs` — a poll-loop job tracker (like tex2pdf), type ``tex``,
  pod-bound: the poll state lives in this pod.
* :mod:`leases.contrib.sessions` — a remote HTTP session (like the MCP browser session),
  type ``browser``, not pod-bound: the session lives in the remote server.
* :mod:`leases.contrib.celery` — ``@leased``: Celery tasks that run holding a lease and
  retry, keeping their place in the queue, when it is busy (a plain module, not an app).
* :mod:`leases.contrib.demo` — a tiny local remote service and the demo consumer loop (a
  plain module the example project uses, not an app).

Add ``"leases.contrib.jobs"`` and/or ``"leases.contrib.sessions"`` to ``INSTALLED_APPS`` to
use them; each registers its revocation handler in its own ``ready()``. The engine app
``leases`` registers no handler of its own.
"""
