"""A sliding-window rate limiter on Redis: parse a rate, and count one hit atomically.

The decision and the increment are one Lua script (``ratelimit.lua``) timed by the
Redis server's clock, so any number of processes share one limit without racing. The
Django decorator lives in ``relier_django.ratelimit``; what it promises:
``docs/ratelimit.md``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import scripts
from .keys import KeySpace

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"(\d+)/(\d*)([smhd])")
# ratelimit.lua compares limit x window_ms in doubles: exact below 2**53.
_MAX_PRODUCT = 2**53


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` hits per ``window_s`` seconds (sliding window)."""

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


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one hit.

    Attributes:
        allowed: the hit was admitted (and counted).
        retry_after_s: when refused, seconds until one hit would be admitted again if no
            other is admitted meanwhile (> 0, ms precision); 0.0 when allowed.
        remaining: when allowed, how many more hits would be admitted at this instant.
    """

    allowed: bool
    retry_after_s: float
    remaining: int


def check_scope(scope: str) -> str:
    """``scope`` if it can name a limiter: non-empty, no braces (they would move the
    key's hash tag). Raises ValueError otherwise."""
    if not scope or any(c in scope for c in "{}"):
        raise ValueError(f"a rate-limit scope must be non-empty, without braces: {scope!r}")
    return scope


def _decision(reply: Sequence[Any]) -> Decision:
    allowed, retry_after_ms, remaining = (int(x) for x in reply)
    return Decision(allowed == 1, retry_after_ms / 1000, remaining)


def hit(keys: KeySpace, scope: str, key: str, rate: Rate) -> scripts.ScriptCall[Decision]:
    """Count one hit on the limiter ``(scope, key)`` if ``rate`` admits it.

    Args:
        keys: the key space.
        scope: what is limited (a view's dotted name); see :func:`check_scope`.
        key: whose hits these are (an IP, a user id, any string); hashed into the key.
        rate: the limit.

    Returns:
        The script call; its reply is the :class:`Decision`. A refused hit writes nothing.
    """
    keys_ = keys.for_ratelimit(check_scope(scope), key)
    return scripts.ScriptCall(scripts.RATELIMIT, keys_, [rate.limit, rate.window_ms], _decision)
