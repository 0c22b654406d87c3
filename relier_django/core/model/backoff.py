"""Backoff between retries: exponential, capped, with jitter so that a burst of
failures does not come back as a burst."""

from __future__ import annotations

import random


def backoff_s(
    attempt: int,
    base_s: float,
    cap_s: float,
    rng: random.Random | None = None,
    *,
    jitter: bool = True,
) -> float:
    """Delay before retry number ``attempt`` (1 = first retry).

    Equal jitter: half of the exponential step is kept, the other half is random, so
    the delay is never zero and never above ``cap_s``. ``jitter=False`` (Celery's
    ``retry_jitter=False``): the whole step, the same for every task.
    """
    if base_s <= 0:
        return 0.0
    step = min(cap_s, base_s * 2.0 ** (attempt - 1))
    if not jitter:
        return step
    return step / 2 + (rng or random).uniform(0, step / 2)
