"""Counters and the waiting queue: who holds the slots of a resource and who is next.

``slots`` (taking and returning slots by booking entry), ``waiting`` (tickets on the gate,
hand-off, repair of slots nobody holds), ``order`` (the one order rule), ``shares`` (tenant
and project weights), ``estimates`` (wait estimates from hold times) and ``wakeups``
(waking the picked waiters over Redis).

Below the engine: ``waiting.repair`` reaps expired holders with the function the engine
installs (:func:`waiting.set_holder_end`), never by importing it.
"""
