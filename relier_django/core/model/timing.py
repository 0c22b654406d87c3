"""When a pushed task may run, and until when: countdown, eta and expiry, as the push
script takes them. Pure; no I/O. The due and expiry times are turned into Redis-clock
times inside ``push.lua``: a countdown counts from the store's clock, not the caller's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

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


def timing(countdown: Any = None, eta: Any = None, expires: Any = None) -> Timing:
    """Celery's ``countdown`` (seconds), ``eta`` (an aware datetime) and ``expires``
    (seconds, or an aware datetime) as a :class:`Timing`.

    Raises:
        TypeError: a value of the wrong type, or a naive datetime (its zone would be a
            guess: the caller's? the server's?).
        ValueError: a countdown or expiry that is negative, NaN or infinite.
    """
    if countdown is None and eta is None and expires is None:
        return NOW
    return Timing(
        countdown_ms=None if countdown is None else _ms("countdown", countdown),
        eta_ms=None if eta is None else _epoch_ms("eta", eta),
        expires_in_ms=_ms("expires", expires) if _is_number(expires) else None,
        expires_at_ms=_epoch_ms("expires", expires) if isinstance(expires, datetime) else None,
    )


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
