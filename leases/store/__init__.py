"""The store layer: everything about MongoDB documents and nothing about lease policy.

``client`` (the pymongo client and collections, indexes, server time, the store timeout),
``documents`` (the stored shapes as ``TypedDict``), ``shapes`` (named accessors of the
tickets' and gates' short fields), ``entries`` (the booking-entry codec a counter's
``holders`` list is written in), the commands of the lease protocol, one pure builder per
command and one module per document kind, each builder with the invariant it keeps
(``holder_commands``, ``counter_commands``, ``ticket_commands``, ``tombstones``),
``server_clock`` (MongoDB's clock without a command per call) and ``embedded`` (the
embedded SecantusDB server for tests and the dev stack).

The bottom of the engine's layers: it imports only ``conf``, ``errors`` and ``ids``. Higher
layers that own a collection register its indexes (:func:`client.register_indexes`).
"""
