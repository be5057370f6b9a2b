"""Operations: what operators see and do, for Insights, the ``lease`` CLI and the admin API.

``reads`` (frozen read models of holders, counters, waiting tickets and lease names, one
module each), ``history`` (a resource's recorded minutes read back), ``lookups`` (does the
tenant, project, pod or resource an operator named exist), ``actions`` (operator revokes,
audited), and the ``lease`` CLI's texts: ``tables`` (aligned plain-text tables) and
``reports`` (one text per report).

Near the top: it may import every engine layer; only the edges (``api``, ``management``,
``insights``) import it.
"""
