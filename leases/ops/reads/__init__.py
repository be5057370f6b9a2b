"""Operator reads shared by Insights → Leases, the ``lease`` CLI and the internal admin API.

Holders, counters, waiting tickets and lease names, as frozen views of the stored
documents, one module per thing read: :mod:`.holders`, :mod:`.counters`, :mod:`.waiters`,
:mod:`.names`. Nothing here writes, to the store or to a cache (the fresh definition view,
which drops this process's cache entry first, is :mod:`leases.definitions.view`). Tenant
binding lives in the MongoDB filter of every read (tokens are global), never in the caller:
a token of another tenant is simply "not found". Every id that reaches a filter is
validated first (:mod:`leases.ids.validation`), so an operator document such as ``{"$ne": ""}``
can never be smuggled in as a value.

The names below are re-exported so callers write ``reads.list_holders``.
"""

from .counters import LEVEL_ORDER, CounterView, globally_full, list_counters
from .holders import MAX_PAGE, MAX_PER_PAGE, HolderPage, HolderView, get_holder, list_holders
from .names import known_lease_names
from .waiters import GLOBAL_BLOCK_NOTE, WaiterList, WaiterView, list_waiters, operator_waiters

__all__ = ["GLOBAL_BLOCK_NOTE", "LEVEL_ORDER", "MAX_PAGE", "MAX_PER_PAGE", "CounterView", "HolderPage", "HolderView",
           "WaiterList", "WaiterView", "get_holder", "globally_full", "known_lease_names", "list_counters",
           "list_holders", "list_waiters", "operator_waiters"]
