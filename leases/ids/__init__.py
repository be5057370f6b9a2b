"""Ids: what a tenant, project, user, lease name, token or pod id may be, and how ids are
written into counter keys, scopes and booking entries.

Two sides of one idea, each a module: :mod:`leases.ids.validation` checks every id (and the
other user-supplied values) before it nears a query; :mod:`leases.ids.encoding` percent-encodes
the key separators in ids that are joined into keys. The encoding's names are re-exported here
(``leases.ids.encode``, ``leases.ids.scope``, ``leases.ids.new_token`` …), so
``from leases import ids`` reads as before.
"""

from __future__ import annotations

from .encoding import counter_key, decode, encode, is_encoded, new_token, readable_key, readable_scope, scope

__all__ = ["counter_key", "decode", "encode", "is_encoded", "new_token", "readable_key", "readable_scope", "scope"]
