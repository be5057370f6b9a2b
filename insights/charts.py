"""Server-rendered SVG charts of lease history: geometry only, the template draws it.

Every mark carries its numbers as a ``title`` (the browser shows it on hover), and each
chart has a table of the same numbers below it, so nothing depends on JavaScript.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from leases.ops.history import MinuteRow

WIDTH = 720
HEIGHT = 150
LEFT = 36  # room for the y-axis labels
BOTTOM = 18  # room for the time labels
PLOT_W = WIDTH - LEFT - 6
PLOT_H = HEIGHT - BOTTOM - 8
TOP = 8


@dataclass
class Mark:
    x: float
    y: float
    w: float
    h: float
    cls: str
    title: str


@dataclass
class Line:
    cls: str
    points: str
    dots: list[Mark] = field(default_factory=list)


@dataclass
class Chart:
    """One chart: bars and/or lines, y ticks, x labels and a legend."""

    key: str
    title: str
    unit: str
    width: int = WIDTH
    height: int = HEIGHT
    bars: list[Mark] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    yticks: list[tuple[float, str]] = field(default_factory=list)
    xlabels: list[tuple[float, str]] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    empty: bool = True
    plot_left: int = LEFT
    plot_right: int = LEFT + PLOT_W
    baseline: float = TOP + PLOT_H


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000,
                 20000, 50000, 100000, 200000, 500000):
        if value <= step:
            return float(step)
    return float(value)


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def _frame(chart: Chart, rows: Sequence[MinuteRow], top: float) -> tuple[float, float]:
    """Axis ticks for ``0..top``; returns (column width, y scale)."""
    n = max(1, len(rows))
    col = PLOT_W / n
    scale = PLOT_H / top
    chart.yticks = [(TOP + PLOT_H - v * scale, _fmt(v)) for v in (0, top / 2, top)]
    every = max(1, n // 6)
    chart.xlabels = [(LEFT + i * col + col / 2, r.minute.strftime("%H:%M"))
                     for i, r in enumerate(rows) if i % every == 0]
    return col, scale


def _when(row: MinuteRow) -> str:
    return row.minute.strftime("%H:%M") + " UTC"


def stacked_bars(key: str, title: str, rows: Sequence[MinuteRow],
                 series: Sequence[tuple[str, str, str]], unit: str = "per minute") -> Chart:
    """Bars per minute, stacked by ``series`` of (attribute or ``reaps.<reason>``, label, css class)."""

    def value(row: MinuteRow, attr: str) -> int:
        if attr.startswith("reaps."):
            return row.reaps.get(attr[6:], 0)
        v = getattr(row, attr)
        return 0 if v is None else int(v)

    chart = Chart(key=key, title=title, unit=unit, legend=[(label, cls) for _, label, cls in series])
    totals = [sum(value(r, a) for a, _, _ in series) for r in rows]
    top = _nice_max(max(totals, default=0))
    col, scale = _frame(chart, rows, top)
    for i, row in enumerate(rows):
        y: float = TOP + PLOT_H
        for attr, label, cls in series:
            v = value(row, attr)
            if not v:
                continue
            h = v * scale
            y -= h
            chart.bars.append(Mark(x=LEFT + i * col + col * 0.1, y=y, w=max(col * 0.8, 0.8), h=h, cls=cls,
                                   title=f"{_when(row)}: {v} {label}"))
            chart.empty = False
    return chart


def lines(key: str, title: str, rows: Sequence[MinuteRow], series: Sequence[tuple[str, str, str]],
          unit: str) -> Chart:
    """One polyline per series over the minutes that have a value (gaps are skipped)."""
    chart = Chart(key=key, title=title, unit=unit, legend=[(label, cls) for _, label, cls in series])
    values = [getattr(r, a) for r in rows for a, _, _ in series if getattr(r, a) is not None]
    top = _nice_max(max(values, default=0))
    col, scale = _frame(chart, rows, top)
    for attr, label, cls in series:
        line = Line(cls=cls, points="")
        pts = []
        for i, row in enumerate(rows):
            v = getattr(row, attr)
            if v is None:
                continue
            x, y = LEFT + i * col + col / 2, TOP + PLOT_H - v * scale
            pts.append(f"{x:.1f},{y:.1f}")
            line.dots.append(Mark(x=x, y=y, w=0, h=0, cls=cls, title=f"{_when(row)}: {label} {_fmt(v)} {unit}"))
            chart.empty = False
        line.points = " ".join(pts)
        chart.lines.append(line)
    return chart


def history_charts(rows: Sequence[MinuteRow], reasons: Sequence[str]) -> list[Chart]:
    """The History tab's four charts."""
    reason_classes = {"idle": "reap-idle", "pod": "reap-pod", "revoke": "reap-revoke"}
    return [
        stacked_bars("grants", "Grants and busy answers", rows,
                     [("grants", "granted", "grant"), ("busy", "busy", "busy")]),
        lines("wait", "Wait of queued acquisitions (p50 / p95)", rows,
              [("wait_p50_ms", "p50", "p50"), ("wait_p95_ms", "p95", "p95")], unit="ms"),
        stacked_bars("peak", "Peak occupancy (slots held at the gate, seen at waits)", rows,
                     [("peak", "slots", "peak")], unit="slots"),
        stacked_bars("reaps", "Reaps by reason", rows,
                     [(f"reaps.{r}", f"reaped ({r})", reason_classes.get(r, "reap-other")) for r in reasons]),
    ]
