"""The retry budget of a push sent at once (``PUSH_WAIT_S``, docs/settings.md): its
Redis calls stop retrying once the budget from their first attempt is spent, nested
retries included, whatever the retry count. A fake clock and sleep: no timing."""

from __future__ import annotations

import asyncio

import pytest
import redis

from relier_django.core.store.retrying import AsyncBoundedRetry, BoundedRetry

pytestmark = pytest.mark.unit


class FakeTime:
    """A clock that moves only when something sleeps or an attempt costs time."""

    def __init__(self, attempt_cost_s: float) -> None:
        self.now = 100.0
        self.attempt_cost_s = attempt_cost_s
        self.attempts = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def refused(self) -> None:
        self.attempts += 1
        self.now += self.attempt_cost_s
        raise redis.exceptions.ConnectionError("Connection refused")


def test_a_refused_connection_is_retried_until_the_budget_and_no_longer():
    t = FakeTime(attempt_cost_s=0.0)  # a refusal costs nothing: only the backoff counts
    retry = BoundedRetry(1.0, clock=t.clock, sleep=t.sleep)
    with pytest.raises(redis.exceptions.ConnectionError):
        retry.call_with_retry(t.refused, lambda error: None)
    assert t.attempts >= 2  # it did retry
    assert t.now - 100.0 <= 1.0  # and never slept past the budget


def test_an_attempt_that_costs_the_whole_budget_is_not_retried():
    # A blackholed server: one connect timeout (bounded by the budget too) spends it.
    t = FakeTime(attempt_cost_s=1.0)
    retry = BoundedRetry(1.0, clock=t.clock, sleep=t.sleep)
    with pytest.raises(redis.exceptions.ConnectionError):
        retry.call_with_retry(t.refused, lambda error: None)
    assert t.attempts == 1


def test_nested_calls_share_the_outermost_budget():
    # redis-py retries a command around its connection's connect, each with its own
    # copy of the policy: the inner loop must not start a budget of its own.
    t = FakeTime(attempt_cost_s=0.3)
    outer = BoundedRetry(1.0, clock=t.clock, sleep=t.sleep)
    inner = BoundedRetry(1.0, clock=t.clock, sleep=t.sleep)

    def command() -> None:
        inner.call_with_retry(t.refused, lambda error: None)

    with pytest.raises(redis.exceptions.ConnectionError):
        outer.call_with_retry(command, lambda error: None)
    # 0.3 s per attempt within one shared second: 4 attempts at most (the fourth
    # starts before the budget ends), never 4 per level.
    assert t.attempts <= 4 and t.now - 100.0 <= 1.0 + 0.3


def test_a_permanent_error_is_raised_at_once():
    t = FakeTime(attempt_cost_s=0.0)

    def wrong_password() -> None:
        t.attempts += 1
        raise redis.exceptions.AuthenticationError("WRONGPASS")

    with pytest.raises(redis.exceptions.AuthenticationError):
        BoundedRetry(5.0, clock=t.clock, sleep=t.sleep).call_with_retry(
            wrong_password, lambda error: None
        )
    assert t.attempts == 1


def test_the_async_policy_keeps_the_same_budget():
    t = FakeTime(attempt_cost_s=1.0)

    async def refused() -> None:
        t.refused()

    async def fail(error: Exception) -> None:
        pass

    retry = AsyncBoundedRetry(1.0, clock=t.clock)
    with pytest.raises(redis.exceptions.ConnectionError):
        asyncio.run(retry.call_with_retry(refused, fail))
    assert t.attempts == 1


def test_a_success_after_refusals_returns_its_value():
    t = FakeTime(attempt_cost_s=0.0)
    replies = iter([redis.exceptions.ConnectionError("refused"), "PONG"])

    def flaky() -> str:
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    assert (
        BoundedRetry(1.0, clock=t.clock, sleep=t.sleep).call_with_retry(flaky, lambda error: None)
        == "PONG"
    )


def test_a_push_waits_push_wait_s_unless_a_running_task_makes_it():
    from celery._state import _task_stack

    from relier_django.core.model.config import Config
    from relier_django.core.push import producer
    from testproject.demo import tasks

    cfg = Config(push_wait_s=0.25)
    assert producer.waits_for(cfg) == 0.25  # a request, a script: bounded
    _task_stack.push(tasks.sync_record)  # as Celery does around a running task's body
    try:
        assert producer.waits_for(cfg) is None  # the workers' REDIS_RETRY_S policy
    finally:
        _task_stack.pop()
