"""Revocation: what happens to a lease's consumer when the lease is taken away.

``handlers`` (lease types, their revocation handlers, the ``RevokedHolder`` they get),
``listener`` (the seam the engine and the reaper notify), ``dispatch`` (the listener's
implementation: runs handlers on the holder's pod over HTTP, or here), ``explain`` (what a
revocation does, or what one without a handler leaves behind, in words for operators),
``remote`` (operator revokes and sweeps through a live pod's admin API) and ``audit`` (the
audit trail of operator actions).

Below the queue and the engine, which notify it; it reaches pods (liveness, identity) and
the store below it. The app installs the dispatcher as the listener.
"""
