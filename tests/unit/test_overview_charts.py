"""The admin overview's charts (docs/admin-overview.md) are drawn on the server as
inline SVG by pure functions: well-formed XML, an accessible title, bar heights and dot
positions proportional to the values, the axis maximum with its unit, a "no data" note
when there is nothing to draw, and every text escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from relier_django.admin.charts import hh_mm, svg_bars, svg_lines
from relier_django.admin.overview import charts, duration
from relier_django.core.observe.measurements import Minute

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def texts(root: ET.Element, css: str) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text") if css in t.get("class", "").split()]


def bars(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]


def plot(root: ET.Element) -> tuple[float, float, float, float]:
    """The plot area, as its frame draws it: left, top, width, height."""
    (frame,) = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "frame"]
    left, top, width, height = (float(frame.get(a)) for a in ("x", "y", "width", "height"))
    return left, top, width, height


def test_bar_heights_are_proportional_to_the_values_and_the_tallest_fills_the_plot():
    root = parse(svg_bars([(0, 2), (60, 8), (120, 0), (180, 4)], title="Committed", unit="t"))
    heights = [float(b.get("height")) for b in bars(root)]
    _, top, _, plot_h = plot(root)
    assert heights == pytest.approx([plot_h / 4, plot_h, 0, plot_h / 2], abs=0.01)
    # Bars stand on the plot's floor, left to right in the points' order.
    bottoms = {round(float(b.get("y")) + float(b.get("height")), 2) for b in bars(root)}
    assert bottoms == {top + plot_h}
    xs = [float(b.get("x")) for b in bars(root)]
    assert xs == sorted(xs)
    assert [b.get("data-value") for b in bars(root)] == ["2", "8", "0", "4"]


def test_a_bar_chart_has_a_title_an_aria_label_and_the_axis_maximum_with_its_unit():
    root = parse(svg_bars([(0, 1.5), (60, 3)], title="Tasks a minute", unit="tasks/min"))
    assert root.get("role") == "img" and root.get("aria-label") == "Tasks a minute"
    assert root.find(f"{SVG}title").text == "Tasks a minute"
    assert texts(root, "axis-max") == ["max 3 tasks/min"]
    assert texts(root, "no-data") == []
    tips = [b.find(f"{SVG}title").text for b in bars(root)]
    assert tips == ["0: 1.5 tasks/min", "60: 3 tasks/min"]


def test_x_labels_name_the_first_and_last_point():
    root = parse(svg_bars([(0, 1), (3540, 2)], title="t", unit="u", x_label=hh_mm))
    assert texts(root, "x-first") == ["00:00"] and texts(root, "x-last") == ["00:59"]


def test_empty_data_draws_an_empty_frame_with_a_no_data_note():
    for svg in (
        svg_bars([], title="Nothing", unit="tasks/min"),
        svg_lines([("mean", []), ("max", [])], title="Nothing", unit="s"),
    ):
        root = parse(svg)
        assert texts(root, "no-data") == ["no data"]
        assert texts(root, "axis-max") == [] and bars(root) == []
        assert list(root.iter(f"{SVG}circle")) == [] and list(root.iter(f"{SVG}polyline")) == []
        assert [r for r in root.iter(f"{SVG}rect") if r.get("class") == "frame"]


def test_all_zero_values_draw_flat_bars_not_a_division_by_zero():
    root = parse(svg_bars([(0, 0), (60, 0)], title="Quiet", unit="tasks/min"))
    assert [float(b.get("height")) for b in bars(root)] == [0.0, 0.0]
    assert texts(root, "axis-max") == ["max 0 tasks/min"]


def test_line_dots_are_placed_proportionally_on_the_x_span_and_the_value_axis():
    series = [("mean", [(60, 1.0), (120, 2.0)]), ("max", [(60, 4.0), (180, 2.0)])]
    root = parse(svg_lines(series, title="Recovery", unit="s", x_span=(0, 240)))
    left, top, plot_w, plot_h = plot(root)
    dots = [(float(c.get("cx")), float(c.get("cy"))) for c in root.iter(f"{SVG}circle")]
    expected = [(60, 1.0), (120, 2.0), (60, 4.0), (180, 2.0)]
    assert [x for x, _ in dots] == pytest.approx([left + x / 240 * plot_w for x, _ in expected])
    assert [y for _, y in dots] == pytest.approx(
        [top + plot_h * (1 - v / 4) for _, v in expected], abs=0.01
    )
    assert texts(root, "axis-max") == ["max 4 s"]
    assert texts(root, "legend") == ["mean", "max"]


def test_a_gap_in_the_data_breaks_the_line():
    points = [(0, 1.0), (60, 2.0), (300, 1.0), (360, 3.0)]
    root = parse(svg_lines([("mean", points)], title="r", unit="s", gap=60))
    assert len(list(root.iter(f"{SVG}polyline"))) == 2
    assert len(list(root.iter(f"{SVG}circle"))) == 4
    one_point = parse(svg_lines([("mean", [(0, 1.0)])], title="r", unit="s"))
    assert list(one_point.iter(f"{SVG}polyline")) == []  # a lone point is a dot
    assert len(list(one_point.iter(f"{SVG}circle"))) == 1


def test_every_text_is_escaped():
    hostile = '<script>alert(1)</script>"&'
    for svg in (
        svg_bars([(0, 1)], title=hostile, unit=hostile, x_label=lambda x: hostile),
        svg_lines([(hostile, [(0, 1.0)])], title=hostile, unit=hostile, x_label=lambda x: hostile),
    ):
        assert "<script>" not in svg
        root = parse(svg)  # still one well-formed element
        assert root.get("aria-label") == hostile
        assert root.find(f"{SVG}title").text == hostile


def test_the_overview_charts_of_an_hour_one_bar_a_minute_and_recovery_only_where_some():
    minutes = [Minute(i * 60) for i in range(60)]
    minutes[10] = Minute(600, committed=5, dead_lettered=1)
    minutes[20] = Minute(1200, committed=10, recoveries=2, recovery_sum_s=3.0, recovery_max_s=2.5)
    drawn = {name: parse(svg) for name, svg in charts(minutes).items()}
    assert set(drawn) == {"throughput", "recovery", "dlq_inflow"}
    assert [b.get("data-value") for b in bars(drawn["throughput"])][10:21:10] == ["5", "10"]
    assert len(bars(drawn["dlq_inflow"])) == 60
    assert texts(drawn["dlq_inflow"], "axis-max") == ["max 1 tasks/min"]
    dots = [c.get("data-value") for c in drawn["recovery"].iter(f"{SVG}circle")]
    assert dots == ["1.5", "2.5"]  # the one minute with recoveries: mean, then max
    quiet = parse(charts([Minute(i * 60) for i in range(60)])["recovery"])
    assert texts(quiet, "no-data") == ["no data"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.35, "350 ms"), (4.24, "4.2 s"), (185, "3 min 5 s"), (7800, "2 h 10 min")],
)
def test_durations_read_in_the_unit_that_fits(seconds, text):
    assert duration(seconds) == text
