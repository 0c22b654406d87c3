"""When a pushed task may run, and until when: countdown, eta and expiry, as the push
script takes them. Pure; no I/O. The due and expiry times are turned into Redis-clock
times inside ``push.lua``: a countdown counts from the store's clock, not the caller's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

LATEST_MS = 253_402_214_400_000
"""The latest due or expiry time a push may ask for, epoch ms: 9999-12-31T00:00:00Z
(exclusive). Every time relier stores is shown as a date somewhere (the schedule
listings, the admin, ``--json``, the task's ``ctx.scheduled_at``), and a date ends
with Python's ``datetime`` at 9999-12-31T23:59:59.999999: a time past it cannot be
shown at all. A day short of that end leaves room for any timezone's offset (at most
14 hours) when a page shows it in local time, and for the store's clock running ahead
of the caller's (a countdown counts from the store's). Redis and Lua hold it exactly
(2.5e14 is below 2**53)."""
EARLIEST_MS = -62_135_510_400_000
"""The earliest eta or expiry a push may name, epoch ms: 0001-01-02T00:00:00Z, a day
after the first date ``datetime`` holds (the same margin as :data:`LATEST_MS`). Any
time in the past means "now"; only one before the first date could not be shown."""
BOUNDS_TEXT = "between 0001-01-02T00:00:00Z and 9999-12-31T00:00:00Z (UTC)"

_AWARE_HINT = (
    "pass a timezone-aware datetime (e.g. django.utils.timezone.now() + timedelta(...)) "
    "or a countdown in seconds"
)


@dataclass(frozen=True, slots=True)
class Timing:
    """A push's schedule, all optional (``None``: now, never expires).

    Attributes:
        countdown_ms: due this long after the push, on the store's clock.
        eta_ms: due at this epoch time, ms (wins over ``countdown_ms``).
        expires_in_ms: not started this long after the push: dead-lettered (expired).
        expires_at_ms: not started by this epoch time, ms: dead-lettered (expired).
    """

    countdown_ms: int | None = None
    eta_ms: int | None = None
    expires_in_ms: int | None = None
    expires_at_ms: int | None = None

    @property
    def delayed(self) -> bool:
        return self.countdown_ms is not None or self.eta_ms is not None

    def script_args(self) -> list[str | int]:
        """push.lua's last four arguments ('' for each one not given)."""
        values = (self.countdown_ms, self.eta_ms, self.expires_in_ms, self.expires_at_ms)
        return ["" if v is None else v for v in values]


NOW = Timing()


@dataclass(frozen=True, slots=True)
class Debounce:
    """A debounced push (``push_with(debounce_s=...)``): it waits ``window_ms``, and a
    later debounced push of the same key within that wait supersedes it (trailing
    edge: the last push of a burst runs, with its own arguments).

    Attributes:
        window_ms: the quiet window, ms: the push is due this long after it is stored.
        key: the caller's ``debounce_key``; ``None``: the task's arguments are the key.
    """

    window_ms: int
    key: str | None = None


def debounce(debounce_s: Any = None, debounce_key: Any = None) -> Debounce | None:
    """``push_with``'s ``debounce_s`` (seconds, or a timedelta) and ``debounce_key`` as
    a :class:`Debounce`; ``None`` when ``debounce_s`` is not given.

    Raises:
        TypeError: a value of the wrong type, or ``debounce_key`` without ``debounce_s``.
        ValueError: a window that is not above 0, NaN or infinite, or past
            :data:`LATEST_MS`; an empty key.
    """
    if debounce_s is None:
        if debounce_key is not None:
            raise TypeError("debounce_key= names a debounce window: give debounce_s= too")
        return None
    window_ms = _ms("debounce_s", debounce_s)
    if window_ms <= 0 or time.time() * 1000 + window_ms >= LATEST_MS:
        raise ValueError(
            f"debounce_s={debounce_s!r}: a debounce window is above 0 seconds, and ends "
            f"{BOUNDS_TEXT}"
        )
    if debounce_key is not None and not (isinstance(debounce_key, str) and debounce_key):
        raise TypeError(f"debounce_key= takes a non-empty str, got {debounce_key!r}")
    return Debounce(window_ms, debounce_key)


def timing(
    countdown: Any = None, eta: Any = None, expires: Any = None, now_ms: int | None = None
) -> Timing:
    """Celery's ``countdown`` (seconds), ``eta`` (an aware datetime) and ``expires``
    (seconds, or an aware datetime) as a :class:`Timing`.

    Args:
        now_ms: the caller's clock, epoch ms (default: ``time.time()``), against which
            a countdown or an expiry in seconds is held to :data:`LATEST_MS`.

    Raises:
        TypeError: a value of the wrong type, or a naive datetime (its zone would be a
            guess: the caller's? the server's?).
        ValueError: a countdown or expiry that is negative, NaN or infinite, or any of
            the three that falls outside :data:`EARLIEST_MS` .. :data:`LATEST_MS`
            (9999-12-31 UTC, exclusive); the message states the bounds.
    """
    if countdown is None and eta is None and expires is None:
        return NOW
    now = int(time.time() * 1000) if now_ms is None else now_ms
    when = Timing(
        countdown_ms=None if countdown is None else _ms("countdown", countdown),
        eta_ms=None if eta is None else _epoch_ms("eta", eta),
        expires_in_ms=_ms("expires", expires) if _is_number(expires) else None,
        expires_at_ms=_epoch_ms("expires", expires) if isinstance(expires, datetime) else None,
    )
    for name, value, at_ms in (
        ("countdown", countdown, None if when.countdown_ms is None else now + when.countdown_ms),
        ("eta", eta, when.eta_ms),
        ("expires", expires, when.expires_at_ms),
        ("expires", expires, None if when.expires_in_ms is None else now + when.expires_in_ms),
    ):
        if at_ms is not None and not EARLIEST_MS <= at_ms < LATEST_MS:
            fix = (
                "leave expires out for a task that never expires"
                if name == "expires"
                else "push it nearer its time (e.g. from a periodic entry), or not at all"
            )
            raise ValueError(
                f"{name}={value!r} puts the task outside the times relier can schedule: a "
                f"due or expiry time must fall {BOUNDS_TEXT}; {fix}"
            )
    return when


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | timedelta) and not isinstance(value, bool)


def _ms(name: str, value: Any) -> int:
    if not _is_number(value):
        raise TypeError(f"{name}= takes seconds (int, float or timedelta), got {value!r}")
    seconds = float(value.total_seconds() if isinstance(value, timedelta) else value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{name}= must be a finite number of seconds >= 0, got {value!r}")
    return math.ceil(seconds * 1000)


def _epoch_ms(name: str, value: Any) -> int:
    if not isinstance(value, datetime):
        raise TypeError(f"{name}= takes a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise TypeError(f"{name}={value!r} is a naive datetime; {_AWARE_HINT}")
    return math.floor(value.timestamp() * 1000)


def as_utc(ms: int) -> datetime | None:
    """``ms`` (epoch ms) as an aware UTC datetime; None for a time no ``datetime``
    holds (past year 9999, before year 1), which a push made before times were bounded
    may have stored: a listing shows it with :func:`unshowable` rather than fail."""
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def unshowable(ms: int) -> str:
    """How a listing shows a time :func:`as_utc` cannot: the stored number itself."""
    return f"{ms} ms since the epoch (out of range)"
