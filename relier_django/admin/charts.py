"""Charts drawn as inline SVG for the admin's overview (``admin_overview``): bars and
lines over time, with a title, an axis-max label, time labels and a "no data" note.

Pure functions: no JavaScript, no asset to fetch, no inline style for a
Content-Security-Policy to refuse. Every text they write is escaped, which is why the
view may mark their output safe.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

# Chart geometry, in SVG user units (CSS pixels at 100%): the plot sits between the
# axis-max label above and the time labels below.
WIDTH, HEIGHT = 280, 140
_LEFT, _RIGHT, _TOP, _BOTTOM = 6, 6, 24, 20
# The admin's own colours (--primary, --secondary, --error-fg, quiet text), as fixed
# values: readable on its light and dark themes alike.
BAR_FILL = "#79aec8"
SERIES_STROKES = ("#417690", "#ba2121", "#5b80b2")
TEXT_FILL = "#888888"
FRAME_STROKE = "#cccccc"


def number(value: float) -> str:
    """A figure as a chart labels it: ``12``, ``0.25``, ``1.5e+03`` (3 significant digits)."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"


def _c(value: float) -> str:
    return f"{value:.2f}"


def _open(title: str, width: int, height: int, kind: str) -> list[str]:
    label = escape(title, quote=True)
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="relier-chart relier-chart-{kind}" '
        f'role="img" aria-label="{label}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f"<title>{label}</title>",
        f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{width - _LEFT - _RIGHT}" '
        f'height="{height - _TOP - _BOTTOM}" fill="none" stroke="{FRAME_STROKE}"/>',
    ]


def _text(x: float, y: float, text: str, css: str, anchor: str = "start") -> str:
    return (
        f'<text class="{css}" x="{_c(x)}" y="{_c(y)}" text-anchor="{anchor}" '
        f'font-size="11" fill="{TEXT_FILL}">{escape(text)}</text>'
    )


def _labels(
    axis_max: float | None, unit: str, span: tuple[int, int] | None,
    x_label: Callable[[int], str], width: int, height: int,
) -> list[str]:  # fmt: skip
    """The axis-max label (top left), the first and last x (bottom), or "no data"."""
    if axis_max is None or span is None:
        return [_text(width / 2, (height + _TOP - _BOTTOM) / 2 + 4, "no data", "no-data", "middle")]
    return [
        _text(_LEFT, _TOP - 8, f"max {number(axis_max)} {unit}", "axis-max"),
        _text(_LEFT, height - 6, x_label(span[0]), "x-first"),
        _text(width - _RIGHT, height - 6, x_label(span[1]), "x-last", "end"),
    ]


def svg_bars(
    points: Sequence[tuple[int, float]],
    *,
    title: str,
    unit: str,
    x_label: Callable[[int], str] = str,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """A bar chart as a standalone ``<svg>`` element, one bar per point, in order.

    Args:
        points: ``(x, value)`` pairs, one per slot (e.g. minute start, epoch seconds,
            and that minute's count); negative values draw as 0.
        title: the chart's accessible name (``<title>`` and ``aria-label``).
        unit: the values' unit, shown with the axis maximum (``tasks/min``).
        x_label: how an ``x`` is written under the chart (first and last only).
        width: pixels. height: pixels.

    Returns:
        SVG markup: every text escaped, so it is safe to embed in HTML. The tallest bar
        fills the plot; each bar's height is proportional to its value. No points: an
        empty frame with a "no data" note.
    """
    out = _open(title, width, height, "bars")
    plot_w, plot_h = width - _LEFT - _RIGHT, height - _TOP - _BOTTOM
    values = [max(0.0, float(v)) for _, v in points]
    axis_max = max(values, default=None)
    slot = plot_w / len(points) if points else 0.0
    bar_w = max(1.0, slot * 0.8)
    for i, ((x, _), value) in enumerate(zip(points, values, strict=True)):
        h = value / axis_max * plot_h if axis_max else 0.0
        left = _LEFT + i * slot + (slot - bar_w) / 2
        tip = escape(f"{x_label(x)}: {number(value)} {unit}")
        out.append(
            f'<rect class="bar" x="{_c(left)}" y="{_c(_TOP + plot_h - h)}" width="{_c(bar_w)}" '
            f'height="{_c(h)}" fill="{BAR_FILL}" data-value="{number(value)}">'
            f"<title>{tip}</title></rect>"
        )
    span = (points[0][0], points[-1][0]) if points else None
    out += _labels(axis_max, unit, span, x_label, width, height)
    out.append("</svg>")
    return "".join(out)


def _runs(points: Sequence[tuple[int, float]], gap: int | None) -> list[list[tuple[int, float]]]:
    """Points split where the next one is more than ``gap`` further on: no line is
    drawn across a stretch without data."""
    runs: list[list[tuple[int, float]]] = []
    for point in points:
        if runs and (gap is None or point[0] - runs[-1][-1][0] <= gap):
            runs[-1].append(point)
        else:
            runs.append([point])
    return runs


def svg_lines(
    series: Sequence[tuple[str, Sequence[tuple[int, float]]]],
    *,
    title: str,
    unit: str,
    x_span: tuple[int, int] | None = None,
    gap: int | None = None,
    x_label: Callable[[int], str] = str,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """A line chart of one or more named series, as a standalone ``<svg>`` element.

    Args:
        series: ``(name, points)``; points are ``(x, value)``, x ascending. Only the
            x with a value are given (a minute without recoveries is left out).
        title: the accessible name. unit: the values' unit (``s``).
        x_span: the x axis, first and last (default: the points' own).
        gap: points further apart than this are not joined by a line (each is still
            marked with a dot).
        x_label: how an ``x`` is written under the chart. width, height: pixels.

    Returns:
        SVG markup with every text escaped; "no data" when no series has a point.
    """
    out = _open(title, width, height, "lines")
    xs = [x for _, points in series for x, _ in points]
    axis_max = max((max(0.0, float(v)) for _, pts in series for _, v in pts), default=None)
    span = x_span or ((min(xs), max(xs)) if xs else None)
    frame = None
    if axis_max is not None and span is not None:
        frame = _Frame(span, axis_max, width - _LEFT - _RIGHT, height - _TOP - _BOTTOM)
    for i, (name, points) in enumerate(series):
        stroke = SERIES_STROKES[i % len(SERIES_STROKES)]
        if frame is not None:
            tip = functools.partial(_tip, name, x_label, unit)
            out += _series(f"series-{i}", stroke, points, frame, gap, tip)
        legend_x = width - _RIGHT - 70 * (len(series) - i)
        out.append(f'<rect x="{legend_x}" y="{_TOP - 16}" width="10" height="3" fill="{stroke}"/>')
        out.append(_text(legend_x + 13, _TOP - 8, name, f"legend series-{i}"))
    out += _labels(axis_max, unit, span if frame else None, x_label, width, height)
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class _Frame:
    """Where a line chart's point is drawn: its x span, its axis maximum, the plot."""

    span: tuple[int, int]
    axis_max: float
    plot_w: float
    plot_h: float

    def at(self, x: int, value: float) -> tuple[float, float]:
        first, last = self.span
        across = min(1.0, max(0.0, (x - first) / ((last - first) or 1)))
        up = max(0.0, float(value)) / self.axis_max if self.axis_max else 0.0
        return _LEFT + across * self.plot_w, _TOP + self.plot_h * (1 - up)


def _tip(name: str, x_label: Callable[[int], str], unit: str, x: int, value: float) -> str:
    return f"{name} {x_label(x)}: {number(value)} {unit}"


def _series(
    css: str, stroke: str, points: Sequence[tuple[int, float]], frame: _Frame,
    gap: int | None, tip: Callable[[int, float], str],
) -> list[str]:  # fmt: skip
    """One series: a line through each run of close points, and a dot on every point."""
    out = []
    for run in _runs(points, gap):
        if len(run) > 1:
            coords = " ".join(f"{_c(px)},{_c(py)}" for px, py in (frame.at(*p) for p in run))
            out.append(
                f'<polyline class="line {css}" points="{coords}" fill="none" '
                f'stroke="{stroke}" stroke-width="1.5"/>'
            )
    for x, v in points:
        px, py = frame.at(x, v)
        out.append(
            f'<circle class="dot {css}" cx="{_c(px)}" cy="{_c(py)}" r="2.5" fill="{stroke}" '
            f'data-value="{number(v)}"><title>{escape(tip(x, v))}</title></circle>'
        )
    return out


def hh_mm(at_s: int) -> str:
    """A minute's start (epoch seconds) as ``HH:MM`` UTC."""
    return datetime.fromtimestamp(at_s, tz=UTC).strftime("%H:%M")
