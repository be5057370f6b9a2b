"""Lease definitions: what a lease name means for a tenant and project.

``model`` (the definition, the bundled defaults, resolution through the layers, the
process cache), ``schema`` (a layer's YAML fields, owners and bounds), ``cache`` (the cache's
rules), ``view`` (the merged definition as operators see it, read afresh), ``layers`` (the stored System and tenant layers and their edits), ``caps``
(cap stamps: a lowered cap binds every process at once), ``undefined`` (names acquired
without a definition) and ``invalidation`` (the cache's Redis subscription).

Imports only the store and the bottom modules (``conf``, ``errors``, ``ids``, ``validation``).
"""
