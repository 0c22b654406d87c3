"""Celery's ``self.request`` and ``self.retry()`` on a relier context (issue 39), with
no server: the request view's fields, the fields relier cannot honour, and what
``retry()`` decides (the runner and eager mode act on it: tests/integration/
test_bound_tasks.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from celery.exceptions import MaxRetriesExceededError, Retry

from relier_django import TaskContext, rl_task
from relier_django.core.model.backoff import backoff_s
from relier_django.core.model.request import UNSUPPORTED, Request, RetryPolicy


def eager_ctx(attempt: int = 1, max_retries: int | None = 3, delay_s: float = 180.0):
    """A context as eager mode builds one: not called directly, retries allowed."""
    ctx = TaskContext.inline(
        "unit.bound", "t-1", attempt, fence_token=attempt,
        request=Request("t-1", "unit.bound", attempt - 1, ("a",), {"k": 1}, is_eager=True),
        retry_policy=RetryPolicy(max_retries, delay_s),
    )  # fmt: skip
    return ctx


def test_the_request_has_celery_s_fields_and_meanings():
    due = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    request = Request(
        "t-1", "unit.bound", 2, ("a", 1), {"k": "v"}, scheduled_at=due,
        hostname="host", queue="mail",
    )  # fmt: skip
    assert (request.id, request.task, request.retries) == ("t-1", "unit.bound", 2)
    assert (request.args, dict(request.kwargs)) == (("a", 1), {"k": "v"})
    assert request.eta == "2026-01-02T03:04:05+00:00"  # ISO 8601, as Celery's worker gives
    assert request.hostname == "host" and request.delivery_info == {"routing_key": "mail"}
    assert request.is_eager is False and request.called_directly is False
    # Outside a workflow: its own root, no group, no chord; correlation_id is the id.
    assert request.root_id == "t-1" and request.correlation_id == "t-1"
    assert request.group is None and request.chord is None and request.group_index is None
    assert request.get("retries") == 2 and request.get("x-custom", "d") == "d"


def test_a_workflow_member_s_request_names_its_workflow_and_chord():
    member = Request("t-2", "unit.bound", 0, workflow="g-1",
                     chord_member={"id": "g-1", "index": 3, "callback": {}})  # fmt: skip
    assert member.root_id == "g-1" and member.group == "g-1" and member.taskset == "g-1"
    assert member.chord == "g-1" and member.group_index == 3
    step = Request("t-3", "unit.bound", 0, workflow="first")
    assert step.root_id == "first"
    with pytest.raises(NotImplementedError, match=r"request\.group.*root_id"):
        _ = step.group


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_a_field_relier_cannot_honour_raises_naming_the_alternative(name):
    request = Request("t-1", "unit.bound", 0)
    with pytest.raises(NotImplementedError, match=rf"self\.request\.{name} is not available"):
        getattr(request, name)
    with pytest.raises(NotImplementedError):  # get() does not hide it behind a default
        request.get(name, None)


def test_a_name_celery_does_not_define_is_an_attribute_error():
    with pytest.raises(AttributeError):
        _ = Request("t-1", "unit.bound", 0).no_such_field  # type: ignore[attr-defined]


def test_the_request_is_read_only():
    request = Request("t-1", "unit.bound", 0)
    with pytest.raises(AttributeError):
        request.retries = 5  # type: ignore[misc]


def test_a_hand_built_context_s_request_tells_what_the_context_knows():
    ctx = TaskContext("t-9", 4, 3, 0, "unit.bound", "host-a:123")
    assert (ctx.request.id, ctx.request.retries, ctx.request.hostname) == ("t-9", 2, "host-a")


def test_retry_decides_a_retry_after_its_countdown_and_raises_celery_s_retry():
    ctx = eager_ctx()
    with pytest.raises(Retry) as raised:
        ctx.retry(exc=ConnectionError("down"), countdown=5)
    assert raised.value.when == 5.0 and isinstance(raised.value.exc, ConnectionError)
    assert ctx._retry is not None and not ctx._retry.exhausted
    assert (ctx._retry.delay_s, ctx._retry.error) == (5.0, "ConnectionError: down")


def test_retry_without_a_countdown_waits_the_default_retry_delay_or_until_its_eta():
    ctx = eager_ctx(delay_s=42.0)
    with pytest.raises(Retry):
        ctx.retry()
    assert ctx._retry is not None and ctx._retry.delay_s == 42.0
    ctx = eager_ctx()
    with pytest.raises(Retry):
        ctx.retry(eta=datetime.now(UTC) + timedelta(seconds=30))
    assert ctx._retry is not None and 25 < ctx._retry.delay_s <= 30


def test_retry_with_throw_false_returns_the_retry_and_still_decides_it():
    ctx = eager_ctx()
    returned = ctx.retry(countdown=0, throw=False)
    assert isinstance(returned, Retry) and ctx._retry is not None and ctx._retry.delay_s == 0


def test_out_of_retries_retry_raises_the_exception_and_marks_it_exhausted():
    # max_retries=3: attempts 1..3 may retry (retries 0..2); attempt 4 has none left.
    with pytest.raises(Retry):
        eager_ctx(attempt=3).retry(countdown=1)
    ctx = eager_ctx(attempt=4)
    with pytest.raises(ConnectionError, match="down"):
        ctx.retry(exc=ConnectionError("down"))
    assert ctx._retry is not None and ctx._retry.exhausted
    ctx = eager_ctx(attempt=4)
    with pytest.raises(MaxRetriesExceededError, match=r"Can't retry unit\.bound\[t-1\]"):
        ctx.retry()
    # This call's max_retries wins over the task's.
    with pytest.raises(Retry):
        eager_ctx(attempt=4).retry(max_retries=5)


def test_retry_refuses_what_it_cannot_do():
    ctx = eager_ctx()
    with pytest.raises(TypeError, match="same arguments"):
        ctx.retry(args=(1,))
    with pytest.raises(TypeError, match="timezone-aware"):
        ctx.retry(eta=datetime(2030, 1, 1))
    assert ctx._retry is None


@rl_task(name="unit.request.bound", bind=True)
def bound(self, x: int) -> dict:
    if x < 0:
        raise self.retry(exc=ValueError("negative"))
    return {"called_directly": self.request.called_directly, "args": list(self.request.args)}


def test_a_body_called_as_a_function_is_called_directly_and_retry_raises_at_once():
    assert bound(1) == {"called_directly": True, "args": [1]}
    with pytest.raises(ValueError, match="negative"):  # Celery's: the exc, at once
        bound(-1)


def test_retry_jitter_false_gives_the_whole_backoff_step():
    rng = random.Random(1)
    assert backoff_s(3, 1.0, 60.0, rng, jitter=False) == 4.0
    assert 2.0 <= backoff_s(3, 1.0, 60.0, rng) <= 4.0


def test_parent_id_and_expires_are_what_the_envelope_carries_else_none():
    request = Request("t-1", "unit.bound", 0, parent="t-0", expires_ms=1_767_323_045_000)
    assert request.parent_id == "t-0" and request.get("parent_id") == "t-0"
    assert request.expires == "2026-01-02T03:04:05+00:00"  # ISO 8601, as eta
    bare = Request("t-1", "unit.bound", 0)
    assert bare.parent_id is None and bare.expires is None
