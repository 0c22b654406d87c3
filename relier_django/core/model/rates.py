"""Rates ("5/m", "100/10s"): parsed once, shared by the view rate limiter and push
admission control. Pure: no I/O, so the config can validate rates it is given."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"(\d+)/(\d*)([smhd])")
# ratelimit.lua compares limit x window_ms in doubles: exact below 2**53.
_MAX_PRODUCT = 2**53


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` hits per ``window_s`` seconds: a sliding window for the view
    rate limiter, a fixed window for push admission control."""

    limit: int
    window_s: int

    def __post_init__(self) -> None:
        if self.limit < 1 or self.window_s < 1:
            raise ValueError(f"a rate needs limit >= 1 and window >= 1 s, got {self!r}")
        if self.limit * self.window_ms >= _MAX_PRODUCT:
            raise ValueError(f"rate {self} is too large: limit x window (ms) must be < 2**53")

    @property
    def window_ms(self) -> int:
        return self.window_s * 1000

    @classmethod
    def parse(cls, text: str) -> Rate:
        """Read ``"<count>/<unit>"`` or ``"<count>/<n><unit>"``.

        Args:
            text: e.g. ``"5/m"`` (5 per minute) or ``"100/10s"`` (100 per 10 seconds);
                units ``s``, ``m``, ``h``, ``d``. Spaces around the parts are allowed.

        Returns:
            The rate.

        Raises:
            ValueError: ``text`` is not in that form, or a count or multiplier is 0.
        """
        match = _RATE.fullmatch(re.sub(r"\s+", "", text)) if isinstance(text, str) else None
        if match is None:
            raise ValueError(
                f'a rate looks like "5/m" or "100/10s" (count / optional multiplier and '
                f"a unit s, m, h or d), got {text!r}"
            )
        count, multiplier, unit = match.groups()
        if int(count) < 1 or (multiplier and int(multiplier) < 1):
            raise ValueError(f"a rate's count and multiplier must be >= 1, got {text!r}")
        return cls(int(count), int(multiplier or 1) * _UNIT_S[unit])

    def __str__(self) -> str:
        return f"{self.limit}/{self.window_s}s"


@functools.lru_cache(maxsize=256)
def parse(text: str) -> Rate:
    """``Rate.parse`` with a cache: a push reads its limits on every call."""
    return Rate.parse(text)
