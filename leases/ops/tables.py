"""Plain-text tables and cell formats for operator output (the ``lease`` CLI).

Pure functions of their arguments: no store, no settings. The CLI's texts
(:mod:`leases.ops.reports`) are built from these, and its ``--json`` output uses
:func:`json_default` for the values JSON has no type for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any


def json_default(value: Any) -> Any:
    """A JSON-ready value for ``json.dumps(default=...)``: ISO times, lists for sets and tuples."""
    if isinstance(value, datetime):
        # Stored times are naive UTC (MongoDB's clock).
        return value.isoformat() + ("Z" if value.tzinfo is None else "")
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def when(value: datetime | None) -> str:
    """A stored time to the second, ``-`` for none."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def seconds(value: float | None) -> str:
    """Whole seconds left (``expired Ns`` when negative), ``-`` for none."""
    if value is None:
        return "-"
    if value < 0:
        return f"expired {int(-value)}s"
    return f"{int(value)}s"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Iterable[str] = ()) -> str:
    """Rows as an aligned plain-text table (numbers right-aligned)."""
    rows = [["-" if cell is None or cell == "" else str(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    right = {i for i, h in enumerate(headers) if h in set(numeric)}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(row) for row in rows)
    return "\n".join(out)
