"""Operations: what operators see and do, for Insights, the ``lease`` CLI and the admin API.

``reads`` (frozen read models of holders, counters, definitions, tickets and pods) and
``actions`` (operator revokes, audited).

Near the top: it may import every engine layer; only the edges (``api``, ``management``,
``insights``) import it.
"""
