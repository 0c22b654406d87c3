"""A sliding-window rate limiter on Redis: parse a rate, and count one hit atomically.

The decision and the increment are one Lua script (``ratelimit.lua``) timed by the
Redis server's clock, so any number of processes share one limit without racing. The
Django decorator lives in ``relier_django.ratelimit``; what it promises:
``docs/ratelimit.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..model.rates import Rate
from ..store import scripts
from ..store.keys import KeySpace

__all__ = ["Decision", "Rate", "check_scope", "hit"]


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
