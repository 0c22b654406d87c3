"""The pure parts of reading the figures: histograms, the SLO windows' slots, the last
hour's minutes (core/observe/measurements.py)."""

from __future__ import annotations

import pytest

from relier_django.core.observe import measurements
from relier_django.core.observe.measurements import Histogram

NOW_MS = 1_795_600_000_000 + 30_000  # half a minute into some minute
MINUTE = NOW_MS // 60_000
HOUR = MINUTE // 60


def test_buckets_and_sums_parse_into_histograms():
    raw = {"h:queue_wait:1": 3, "h:queue_wait:18": 1, "h:queue_wait:sum": 400_030,
           "h:recovery:heartbeat:9": 2, "h:recovery:heartbeat:sum": 7_000,
           "committed": 5}  # fmt: skip
    found = measurements._histograms(raw)
    assert found["queue_wait"].counts[0] == 3 and found["queue_wait"].counts[-1] == 1
    assert found["queue_wait"].count == 4 and found["queue_wait"].sum_s == pytest.approx(400.03)
    assert found["recovery:heartbeat"].count == 2  # the name keeps its own colon
    assert set(found) == {"queue_wait", "recovery:heartbeat"}


def test_quantiles_interpolate_inside_their_bucket_as_prometheus_does():
    counts = [0] * (len(measurements.BOUNDS_MS) + 1)
    counts[9] = 10  # ten observations in (5 s, 10 s]
    h = Histogram(tuple(counts), 75.0)
    assert h.quantile(0.5) == pytest.approx(7.5)
    assert h.quantile(1.0) == pytest.approx(10.0)
    assert h.mean() == pytest.approx(7.5)
    assert Histogram().quantile(0.99) is None
    only_inf = [0] * (len(measurements.BOUNDS_MS) + 1)
    only_inf[-1] = 1
    assert Histogram(tuple(only_inf), 900).quantile(0.5) == 300.0  # a floor, as Prometheus


def test_slo_windows_count_only_slots_that_hold_their_own_minute_or_hour():
    windows = {
        f"m{MINUTE % 120}": MINUTE, f"m{MINUTE % 120}:ok": 9, f"m{MINUTE % 120}:dlq": 1,
        # 59 minutes ago: inside the hour
        f"m{(MINUTE - 59) % 120}": MINUTE - 59, f"m{(MINUTE - 59) % 120}:ok": 10,
        # 60 minutes ago: outside it
        f"m{(MINUTE - 60) % 120}": MINUTE - 60, f"m{(MINUTE - 60) % 120}:ok": 1000,
        # a slot still stamped with a minute from a lap ago: stale, never counted
        f"m{(MINUTE - 5) % 120}": MINUTE - 125, f"m{(MINUTE - 5) % 120}:dlq": 1000,
        f"h{HOUR % 80}": HOUR, f"h{HOUR % 80}:ok": 19, f"h{HOUR % 80}:dlq": 1,
        f"h{(HOUR - 5) % 80}": HOUR - 5, f"h{(HOUR - 5) % 80}:ok": 80,
        f"h{(HOUR - 6) % 80}": HOUR - 6, f"h{(HOUR - 6) % 80}:dlq": 100,
    }  # fmt: skip
    one, six, three = measurements._slo(windows, NOW_MS, 0.99)
    assert (one.name, one.committed, one.dead_lettered) == ("1h", 19, 1)
    assert (six.name, six.committed, six.dead_lettered) == ("6h", 99, 1)
    assert (three.name, three.committed, three.dead_lettered) == ("3d", 99, 101)
    assert one.ratio == pytest.approx(0.95) and one.burn == pytest.approx(5.0)


def test_no_outcome_is_a_full_ratio_and_no_burn():
    (one, *_) = measurements._slo({}, NOW_MS, 0.999)
    assert one.ratio == 1.0 and one.burn == 0.0


def test_the_last_hour_is_sixty_minutes_oldest_first_with_gaps_as_zero():
    slot = MINUTE % 120
    windows = {f"m{slot}": MINUTE, f"m{slot}:ok": 4, f"m{slot}:rec_n": 2,
               f"m{slot}:rec_ms": 3000, f"m{slot}:rec_max": 2000}  # fmt: skip
    minutes = measurements._minutes(windows, NOW_MS)
    assert len(minutes) == 60
    assert minutes[0].at_s == (MINUTE - 59) * 60 and minutes[-1].at_s == MINUTE * 60
    last = minutes[-1]
    assert (last.committed, last.recoveries, last.recovery_max_s) == (4, 2, 2.0)
    assert last.recovery_mean_s == pytest.approx(1.5)
    assert all(m.committed == 0 and m.recovery_mean_s is None for m in minutes[:-1])
