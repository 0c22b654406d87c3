"""Tick times of a periodic entry, and which of the due ones to fire. Pure: no I/O.

A tick is named by its time, epoch ms, the same for every scanner: for an interval of N
seconds, the multiples of N since the epoch; for a ``crontab``, its fire times in the
app's timezone as Celery beat computes them (``crontab.remaining_delta``). So two
scanners that see the same Redis clock name the same ticks, and ``periodic`` can fire
each once.
"""

from __future__ import annotations

import collections
import enum
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from celery.schedules import crontab
from celery.schedules import schedule as celery_interval
from celery.utils.time import remaining

CATCH_UP_LIMIT = 10
"""The most missed ticks ``"all"`` fires after an outage; older ones are skipped."""
# A crontab is walked tick by tick; past this many missed ticks the count is estimated.
_WALK_LIMIT = 2_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

MAX_INTERVAL_S = 100 * 365 * 86_400
"""The longest interval an entry may have: 100 years, in seconds. Ticks fall on the
multiples of the interval since the epoch, and each is pushed with its tick as its due
time, which a push holds before 9999-12-31 (``model.timing.LATEST_MS``); a century
keeps every tick thousands of years inside that, and no real schedule comes near it
(a yearly job is a ``crontab``). An infinite interval would stop every entry: its
next tick cannot even be computed."""


class Missed(enum.StrEnum):
    """What an entry does with ticks that passed while no scanner fired them."""

    ALL = "all"
    ONCE = "once"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Due:
    """Ticks in (last, now]: the newest ones (ascending, at most the ``keep`` asked
    for), how many there are in all, and whether that count is exact."""

    ticks: tuple[int, ...]
    total: int
    exact: bool = True


@dataclass(frozen=True, slots=True)
class Every:
    """An interval: ticks at the multiples of ``step_ms`` since the epoch."""

    step_ms: int

    def next_after(self, ms: int) -> int:
        return (ms // self.step_ms + 1) * self.step_ms

    def due(self, last_ms: int, now_ms: int, keep: int) -> Due:
        first, newest = self.next_after(last_ms), now_ms // self.step_ms * self.step_ms
        if newest < first:
            return Due((), 0)
        total = (newest - first) // self.step_ms + 1
        n = min(total, keep)
        return Due(tuple(newest - (n - 1 - i) * self.step_ms for i in range(n)), total)


@dataclass(frozen=True, slots=True)
class Cron:
    """A ``celery.schedules.crontab`` read in ``tz``: its fire times, as Celery beat's
    ``remaining_estimate`` computes them (wall-clock fields; a time a DST change skips
    fires at the same instant as the next hour's, a repeated one fires once)."""

    cron: crontab
    tz: tzinfo

    def next_after(self, ms: int) -> int:
        after = datetime.fromtimestamp(ms / 1000, tz=self.tz)
        start, delta, _ = self.cron.remaining_delta(after, tz=self.tz)
        nxt = int(remaining(start, delta, now=_EPOCH) // _MS)
        # Fire times strictly increase, whatever a DST transition made of the wall clock.
        return nxt if nxt > ms else self.next_after(ms + 60_000 - ms % 60_000)

    def due(self, last_ms: int, now_ms: int, keep: int) -> Due:
        ticks, count, cursor = self._walk(last_ms, now_ms, keep)
        if cursor > now_ms:
            return Due(tuple(ticks), count)
        # A long outage: the newest ticks from a walk over the last half of a stretch as
        # long as the one walked (fewer ticks than it found); the total is estimated
        # from that walk's pace.
        span = max(cursor - last_ms, 1)
        recent, _, _ = self._walk(now_ms - span // 2, now_ms, keep)
        return Due(tuple(recent), max(count, count * (now_ms - last_ms) // span), exact=False)

    def _walk(self, last_ms: int, now_ms: int, keep: int) -> tuple[list[int], int, int]:
        kept: collections.deque[int] = collections.deque(maxlen=keep)
        cursor, count = self.next_after(last_ms), 0
        while cursor <= now_ms and count < _WALK_LIMIT:
            kept.append(cursor)
            count += 1
            cursor = self.next_after(cursor)
        return list(kept), count, cursor


Schedule = Every | Cron


def parse_schedule(value: Any, tz: tzinfo) -> Schedule:
    """An entry's ``schedule`` (seconds, ``timedelta``, ``celery.schedules.schedule`` or
    ``crontab``, read in its own timezone if it was given one, else in ``tz``) as a
    :class:`Schedule`.

    Raises:
        ValueError: any other value, or an interval that is not a finite number of
            seconds from 0.001 to :data:`MAX_INTERVAL_S` (infinite, NaN, zero or
            negative ones included).
    """
    if isinstance(value, crontab):
        # A crontab given a timezone of its own (django-celery-beat's rows carry one)
        # is read in it; Celery's plain crontab has none until asked, then the app's.
        own = vars(value).get("tz")
        return Cron(value, own if isinstance(own, tzinfo) else tz)
    if isinstance(value, celery_interval) and type(value) is celery_interval:
        value = value.run_every
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"an interval must be a finite number of seconds > 0, got {value!r}")
        if value > MAX_INTERVAL_S:
            raise ValueError(
                f"an interval must be at most {MAX_INTERVAL_S} seconds (100 years), got "
                f"{value!r}; a rare job is a celery.schedules.crontab"
            )
        step_ms = round(value * 1000)
        if step_ms >= 1:
            return Every(step_ms)
        raise ValueError(f"an interval must be at least 0.001 seconds, got {value!r}")
    raise ValueError(
        f"{value!r} is not a number of seconds, a timedelta or a celery.schedules.crontab"
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """The ticks to fire (ascending), how many due ones are skipped, and the tick to
    record as handled when none is fired (so a skip is not reconsidered)."""

    fire: tuple[int, ...]
    skipped: int
    skip_to: int | None = None


def plan(missed: Missed, due: Due, now_ms: int, on_time_ms: int) -> Plan:
    """Which of ``due`` to fire under policy ``missed``. Pure."""
    if missed is Missed.ALL:
        fire = due.ticks[-CATCH_UP_LIMIT:]
    elif missed is Missed.ONCE:
        fire = due.ticks[-1:]
    else:
        fire = tuple(t for t in due.ticks if now_ms - t <= on_time_ms)
    skip_to = due.ticks[-1] if due.ticks and not fire else None
    return Plan(fire, due.total - len(fire), skip_to)
