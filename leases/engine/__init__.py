"""The engine: the holder protocol every path to a lease goes through.

``holders`` (renewal, payload, ending a holder, tenant scope), ``commands`` (the holder
commands' documents, built once for the sync and the async executor), ``intervals`` (the
renewal interval a grant issues) and ``pausepoints`` (named pauses for the crash tests).
The acquire funnel (``leases.service``, ``leases.aio``) joins this package after its split.

Imports the queue, revocation seam, telemetry, definitions and store below it; the upkeep,
operator and edge layers above import it.
"""
