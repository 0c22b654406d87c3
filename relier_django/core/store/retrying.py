"""How relier's Redis clients retry: the one policy every client shares.

A restart, a failover or a brief network cut must not fail a task's start or commit:
connection errors are retried with backoff for at least 3.75 s and at most 7.5 s (half
of each delay is fixed, half random: 0.05 s doubling up to 1 s, 10 times; redis-py's
default gives up within about one second). ``REDIS_RETRY_S`` moves that floor (a test
of an unreachable Redis need not wait it out). The fixed half gives a floor: a fully random
delay can add up to under 3 s a few percent of the time, shorter than a Sentinel
failover with down-after-milliseconds 1000 (2.3-2.9 s, measured by
tests/chaos/test_sentinel.py) or a Redis Cluster failover with cluster-node-timeout
1000 (2.2-2.8 s, tests/cluster/test_cluster_failover.py). A longer outage is covered by
the expiry index. Every script these clients run is safe to re-run after an unseen
success: fence checks and push.lua's same-envelope check make a replay a no-op or a
refusal. (ratelimit.lua is not, which is why the limiter uses a fail-fast client.)
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio.retry
import redis.backoff
import redis.retry

RETRIES = 10  # the default budget's (3.75 s): see retries_within
_CAP_S, _BASE_S = 1.0, 0.05


def backoff() -> redis.backoff.AbstractBackoff:
    return redis.backoff.EqualJitterBackoff(cap=_CAP_S, base=_BASE_S)


def retries_within(budget_s: float) -> int:
    """How many retries make the backoff's fixed halves reach ``budget_s`` (the
    ``REDIS_RETRY_S`` setting): the client then retries for at least that long and at
    most twice as long. 3.75 s (the default) gives 10; 0 gives none."""
    retries, waited = 0, 0.0
    while waited < budget_s:
        retries += 1
        waited += min(_CAP_S, _BASE_S * 2**retries) / 2
    return retries


# redis-py's AuthenticationError (a wrong password, a disabled user, NOAUTH) is a
# ConnectionError, so its retry policy retries it: seconds of backoff per call (and
# nested retries around a subscription add up: a resurrector given a wrong password
# took 34 s to start and to honour SIGTERM) for an answer that cannot change.
_PERMANENT = (redis.exceptions.AuthenticationError,)


class _Permanent(Exception):
    """Carries a permanent error out of redis-py's retry loop, which retries only the
    errors it supports; not one of them."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class Retry(redis.retry.Retry):
    """redis-py's retry policy, except that a permanent error is raised at once."""

    def call_with_retry(self, do: Callable[[], Any], fail: Any, *args: Any, **kwargs: Any) -> Any:
        def attempt() -> Any:
            try:
                return do()
            except _PERMANENT as exc:
                raise _Permanent(exc) from exc

        try:
            return super().call_with_retry(attempt, fail, *args, **kwargs)
        except _Permanent as wrapped:
            raise wrapped.error from None


class AsyncRetry(redis.asyncio.retry.Retry):
    """:class:`Retry` for the asyncio clients."""

    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        async def attempt() -> Any:
            try:
                return await do()
            except _PERMANENT as exc:
                raise _Permanent(exc) from exc

        try:
            return await super().call_with_retry(attempt, fail, *args, **kwargs)
        except _Permanent as wrapped:
            raise wrapped.error from None


# The deadline of the outermost bounded call in progress in this thread or task.
# redis-py nests retries (a command's around its connection's connect) and copies the
# policy into each connection, so the deadline lives here, shared by every level.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "relier_retry_deadline", default=None
)


class _Bounded:
    """What the bounded policies share: a budget from the first attempt, and a clock."""

    def _setup(self, budget_s: float, clock: Callable[[], float]) -> None:
        self.budget_s = budget_s
        self._clock = clock

    def _enter(self) -> tuple[float, contextvars.Token[float | None] | None]:
        outer = _deadline.get()
        if outer is not None:
            return outer, None
        deadline = self._clock() + self.budget_s
        return deadline, _deadline.set(deadline)

    def _gives_up(self, error: Exception, deadline: float, delay_s: float) -> bool:
        # Stop when the next attempt would start past the budget: an unreachable Redis
        # costs the budget, not the retry count times the connect timeout.
        return isinstance(error, _PERMANENT) or self._clock() + delay_s >= deadline


class BoundedRetry(_Bounded, Retry):
    """:class:`Retry` (backoff, permanent errors at once) within ``budget_s`` seconds
    from the first attempt, however many attempts fit, nested calls included: the
    policy of a push sent at once (``PUSH_WAIT_S``), whose caller is waiting."""

    def __init__(
        self,
        budget_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(backoff(), -1)
        self._setup(budget_s, clock)
        self._sleep = sleep

    def call_with_retry(
        self,
        do: Callable[[], Any],
        fail: Any,
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> Any:
        deadline, token = self._enter()
        try:
            self._backoff.reset()
            failures = 0
            while True:
                try:
                    return do()
                except self._supported_errors as error:
                    if is_retryable is not None and not is_retryable(error):
                        raise
                    failures += 1
                    fail(error, failures) if with_failure_count else fail(error)
                    delay_s = self._backoff.compute(failures)
                    if self._gives_up(error, deadline, delay_s):
                        raise
                    self._sleep(delay_s)
        finally:
            if token is not None:
                _deadline.reset(token)


class AsyncBoundedRetry(_Bounded, AsyncRetry):
    """:class:`BoundedRetry` for the asyncio clients."""

    def __init__(self, budget_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(backoff(), -1)
        self._setup(budget_s, clock)

    async def call_with_retry(
        self,
        do: Any,
        fail: Any,
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> Any:
        deadline, token = self._enter()
        try:
            self._backoff.reset()
            failures = 0
            while True:
                try:
                    return await do()
                except self._supported_errors as error:
                    if is_retryable is not None and not is_retryable(error):
                        raise
                    failures += 1
                    await (fail(error, failures) if with_failure_count else fail(error))
                    delay_s = self._backoff.compute(failures)
                    if self._gives_up(error, deadline, delay_s):
                        raise
                    await asyncio.sleep(delay_s)
        finally:
            if token is not None:
                _deadline.reset(token)
