"""Pods: the processes that hold leases, and whether they are alive.

``identity`` (this process's pod id), ``leases`` (pod lease documents), ``liveness`` (who is
alive, from them), ``renewer`` (keeps this pod's lease renewed), ``internal_server`` (the
pod's internal HTTP endpoint) and ``process`` (starting a process's machinery once, fork-safe).

Imports definitions (the cache subscription a process starts) and the store below it.
"""
