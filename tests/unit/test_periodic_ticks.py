"""G11, the arithmetic: every scanner names the same tick times, a DST change neither
repeats nor drops a day, and a missed tick follows its policy (schedule/ticks.py)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule

from relier_django.core.schedule import periodic
from relier_django.core.schedule.ticks import (
    CATCH_UP_LIMIT,
    Cron,
    Due,
    Every,
    Missed,
    parse_schedule,
    plan,
)

PARIS = ZoneInfo("Europe/Paris")


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def walk(sched: Cron | Every, start: datetime, n: int) -> list[datetime]:
    out, t = [], ms(start)
    for _ in range(n):
        t = sched.next_after(t)
        out.append(datetime.fromtimestamp(t / 1000, tz=PARIS))
    return out


def test_interval_ticks_are_the_multiples_of_the_interval_since_the_epoch():
    every = Every(30_000)
    assert every.next_after(1_000) == 30_000
    assert every.next_after(30_000) == 60_000  # a tick is strictly after its predecessor
    due = every.due(last_ms=30_000, now_ms=125_000, keep=10)
    assert due == Due((60_000, 90_000, 120_000), 3)
    assert every.due(last_ms=120_000, now_ms=149_999, keep=10) == Due((), 0)


def test_interval_due_keeps_the_newest_ticks_and_counts_them_all():
    due = Every(1_000).due(last_ms=0, now_ms=1_000_500, keep=3)
    assert due.ticks == (998_000, 999_000, 1_000_000)
    assert due.total == 1_000 and due.exact


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5, Every(5_000)),
        (0.25, Every(250)),
        (timedelta(minutes=2), Every(120_000)),
        (schedule(run_every=timedelta(seconds=7)), Every(7_000)),
    ],
)
def test_seconds_timedelta_and_celery_intervals_are_read_as_intervals(value, expected):
    assert parse_schedule(value, UTC) == expected


@pytest.mark.parametrize("value", [0, -1, True, "5", None, timedelta(0)])
def test_a_schedule_that_is_not_a_positive_interval_or_a_crontab_is_refused(value):
    with pytest.raises(ValueError, match="seconds"):
        parse_schedule(value, UTC)


def test_any_other_celery_schedule_is_refused():
    class Custom(schedule):  # a subclass has its own idea of its fire times
        pass

    with pytest.raises(ValueError, match="crontab"):
        parse_schedule(Custom(run_every=5), UTC)


def test_crontab_ticks_are_its_fire_times_in_the_apps_timezone():
    cron = parse_schedule(crontab(minute=0, hour=9), PARIS)
    assert isinstance(cron, Cron)
    start = datetime(2024, 1, 10, 12, tzinfo=PARIS)
    assert walk(cron, start, 2) == [
        datetime(2024, 1, 11, 9, tzinfo=PARIS),
        datetime(2024, 1, 12, 9, tzinfo=PARIS),
    ]
    # 09:00 in Paris is 08:00 UTC in winter: the tick's identity is that instant.
    assert cron.next_after(ms(start)) == ms(datetime(2024, 1, 11, 8, tzinfo=UTC))


@pytest.mark.parametrize("start", [datetime(2024, 3, 28, 12), datetime(2024, 10, 24, 12)])
def test_a_daily_crontab_fires_once_a_day_across_a_dst_change(start):
    cron = Cron(crontab(minute=30, hour=2), PARIS)  # 02:30: skipped in March, twice in October
    fired = walk(cron, start.replace(tzinfo=PARIS), 6)
    assert [d.date() for d in fired] == [start.date() + timedelta(days=i) for i in range(1, 7)]
    stamps = [ms(d) for d in fired]
    assert stamps == sorted(set(stamps))
    gaps_h = [(b - a) / 3_600_000 for a, b in itertools.pairwise(stamps)]
    assert all(23 <= g <= 25 for g in gaps_h), gaps_h


def test_an_hourly_crontab_never_repeats_an_instant_across_the_autumn_change():
    cron = Cron(crontab(minute=30), PARIS)
    fired = walk(cron, datetime(2024, 10, 26, 22, tzinfo=PARIS), 10)
    stamps = [ms(d) for d in fired]
    assert stamps == sorted(set(stamps))
    # The wall clock reads 02:30 twice that night; Celery's crontab fires the first.
    assert sum(d.hour == 2 for d in fired) == 1


def test_a_crontab_catch_up_after_a_long_outage_keeps_the_newest_ticks_and_estimates():
    cron = Cron(crontab(), UTC)  # every minute
    last, now = datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 10, 0, 0, 30, tzinfo=UTC)
    due = cron.due(ms(last), ms(now), keep=3)
    assert due.ticks == tuple(ms(now.replace(second=0)) - i * 60_000 for i in (2, 1, 0))
    assert not due.exact
    assert 12_000 < due.total < 14_000  # 9 days of minutes: 12,960


def test_missed_all_fires_every_missed_tick_up_to_the_limit_and_counts_the_rest():
    due = Every(1_000).due(0, 100_000, CATCH_UP_LIMIT)
    chosen = plan(Missed.ALL, due, 100_000, on_time_ms=5_000)
    assert chosen.fire == tuple(range(91_000, 100_001, 1_000))
    assert chosen.skipped == 90 and chosen.skip_to is None


def test_missed_once_fires_one_catch_up():
    due = Every(1_000).due(0, 100_000, CATCH_UP_LIMIT)
    chosen = plan(Missed.ONCE, due, 100_000, on_time_ms=5_000)
    assert chosen.fire == (100_000,) and chosen.skipped == 99


def test_missed_skip_fires_only_ticks_on_time_and_records_the_skip():
    every = Every(10_000)
    late = plan(Missed.SKIP, every.due(0, 107_000, CATCH_UP_LIMIT), 107_000, on_time_ms=5_000)
    assert late.fire == () and late.skipped == 10 and late.skip_to == 100_000
    on_time = plan(Missed.SKIP, every.due(0, 103_000, CATCH_UP_LIMIT), 103_000, on_time_ms=5_000)
    assert on_time.fire == (100_000,) and on_time.skipped == 9


def test_a_tick_on_time_fires_under_every_policy():
    for missed in Missed:
        chosen = plan(missed, Every(1_000).due(4_000, 5_100, 10), 5_100, on_time_ms=5_000)
        assert chosen.fire == (5_000,) and chosen.skipped == 0


def test_a_ticks_task_id_is_derived_from_entry_and_tick():
    assert periodic.tick_id("nightly", 1_000) == periodic.tick_id("nightly", 1_000)
    ids = {periodic.tick_id(e, t) for e in ("a", "b") for t in (1_000, 2_000)}
    assert len(ids) == 4
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
