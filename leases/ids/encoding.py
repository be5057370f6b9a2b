"""Ids inside counter keys, scopes and booking entries: encoded so separators stay separators.

A counter key is ``<resource>|<level>|<scope>``, a scope ``tenant/project`` or ``tenant/user``,
a booking entry ``tenant/project/user/token``. User ids may be any Django username or email
(``alice.smith``, ``bob@example.com``, even ``a/b`` or ``x|y``), so each id component is
percent-encoded before it is joined: ``%`` → ``%25``, ``/`` → ``%2F``, ``|`` → ``%7C``. Nothing
else is touched, so every id that was valid before (``[A-Za-z0-9_-]``) encodes to itself and the
counters stored for it stay valid; distinct ids always give distinct components (``a/b`` and
``a%2Fb`` encode to ``a%2Fb`` and ``a%252Fb``). Decoding is for display and for reading the
ids back out of an entry; the stored documents keep the plain ids in their own fields.
"""

from __future__ import annotations

import re
import secrets

# ``%`` first on the way in (so the escapes it writes are not escaped again), last on the way out.
_ENCODE = (("%", "%25"), ("/", "%2F"), ("|", "%7C"))
_ESCAPE_RE = re.compile(r"%(25|2F|7C)")
_DECODED = {"25": "%", "2F": "/", "7C": "|"}


def encode(value: str) -> str:
    """``value`` with the key separators ``%``, ``/`` and ``|`` percent-encoded."""
    if "%" not in value and "/" not in value and "|" not in value:
        return value  # the common case: nothing to escape, no new string
    for char, escape in _ENCODE:
        value = value.replace(char, escape)
    return value


def decode(value: str) -> str:
    """The id :func:`encode` made ``value`` from (the inverse; other text is left as is)."""
    return _ESCAPE_RE.sub(lambda m: _DECODED[m.group(1)], value) if "%" in value else value


def is_encoded(value: str) -> bool:
    """Whether ``value`` is the canonical encoding of some id (no raw separator, every ``%``
    starting one of the three escapes)."""
    return encode(decode(value)) == value


def scope(level: str, tenant_id: str, project_id: str, user_id: str) -> str:
    """The scope of a counter at ``level``: ``*``, ``tenant``, ``tenant/project`` or
    ``tenant/user`` (the user level crosses projects on purpose), each id encoded."""
    if level == "global":
        return "*"
    if level == "tenant":
        return encode(tenant_id)
    return f"{encode(tenant_id)}/{encode(project_id if level == 'project' else user_id)}"


def counter_key(resource: str, level: str, scope_: str) -> str:
    """``<resource>|<level>|<scope>`` (``scope_`` as :func:`scope` built it)."""
    return f"{resource}|{level}|{scope_}"


def readable_scope(value: str) -> str:
    """A stored scope as people read it: each id decoded (``acme/alice%2Fx`` → ``acme/alice/x``).

    For display only: the result may be ambiguous, the stored scope never is.
    """
    return "/".join(decode(part) for part in value.split("/"))


def readable_key(value: str) -> str:
    """A counter key as people read it: its scope's ids decoded (display only)."""
    head, sep, tail = value.rpartition("|")
    return f"{head}{sep}{readable_scope(tail)}" if sep else value


def new_token(nbytes: int = 24) -> str:
    """A fresh random token (URL-safe base64 of ``nbytes`` bytes) that never starts with
    ``-``: operators pass tokens to ``manage.py lease show <token>``, where argparse would
    take a leading dash for an option (one token in 64 used to)."""
    while True:
        token = secrets.token_urlsafe(nbytes)
        if not token.startswith("-"):
            return token
