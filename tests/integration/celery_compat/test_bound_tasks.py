"""Celery's bound-task idioms on relier (issue 39): ``self.request`` and
``raise self.retry(exc=..., countdown=...)``, with real Celery workers on a real Redis,
and the same tests in eager mode (``relier_django.testing.eager``).

The tasks (testproject/demo/bound_tasks.py) record what each run saw of
``self.request`` in Redis, so runs are counted apart from the outcome.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from relier_django import TaskFailed, testing
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import bound_tasks
from testproject.harness import wait_until


@pytest.fixture(params=["worker", "eager"])
def mode(request: pytest.FixtureRequest, redis_client: Any) -> Iterator[str]:
    """Each test runs once on a real prefork worker, once in eager mode."""
    if request.param == "worker":
        request.getfixturevalue("worker")
        yield "worker"
        return
    with testing.eager():
        yield "eager"


def seen(client: Any, label: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(f"demo:bound:{label}", 0, -1)]


def dlq_entry(task_id: str) -> Any:
    return DeadLetterStore(sync_client(config.current()), KeySpace("rl")).get(task_id)


@pytest.mark.parametrize(
    "task", [bound_tasks.retrying, bound_tasks.aretrying], ids=["def", "async"]
)
def test_self_retry_runs_new_incarnations_until_the_task_succeeds_once(mode, redis_client, task):
    receipt = task.push("r1", 2, note="n")
    result = receipt.get(timeout=60)
    # Committed by the third run, the only one that returned: retries 2, fence 3.
    assert result == {"retries": 2, "note": "n", "fence": 3}
    runs = seen(redis_client, "r1")
    assert [r["retries"] for r in runs] == [0, 1, 2]
    assert [r["attempt"] for r in runs] == [1, 2, 3]
    assert [r["fence"] for r in runs] == [1, 2, 3]
    for r in runs:
        assert r["id"] == receipt.task_id and r["root_id"] == receipt.task_id
        assert (r["args"], r["kwargs"]) == (["r1", 2], {"note": "n"})
        assert r["task"] == task.name and r["is_eager"] is (mode == "eager")
    if mode == "worker":
        # Each retry waited in the durable schedule for its countdown: due, so eta is set.
        assert runs[0]["eta"] is None and runs[1]["eta"] is not None and runs[2]["eta"]
        assert {r["routing_key"] for r in runs} == {"celery"}
        assert receipt.status == "SUCCESS"
        assert list(DeadLetterStore(sync_client(config.current()), KeySpace("rl")).iter()) == []


def test_exhausted_retries_land_in_the_dlq_with_the_task_s_exception(mode, redis_client):
    receipt = bound_tasks.hopeless.push("h1")
    with pytest.raises(TaskFailed) as err:
        receipt.get(timeout=60)
    assert err.value.reason == "retries_exhausted"
    assert "TimeoutError: h1: still down" in err.value.error
    runs = seen(redis_client, "h1")
    assert [r["retries"] for r in runs] == [0, 1, 2]  # the first run + max_retries=2
    if mode == "worker":
        entry = dlq_entry(receipt.task_id)
        assert entry.reason == "retries_exhausted"
        assert entry.data["exc_type"] == "TimeoutError"
        assert [h["event"] for h in entry.history].count("start") == 3


def test_exhausted_retries_without_an_exception_raise_max_retries_exceeded(mode, redis_client):
    receipt = bound_tasks.hopeless_bare.push("b1")
    with pytest.raises(TaskFailed) as err:
        receipt.get(timeout=60)
    assert err.value.reason == "retries_exhausted"
    assert "MaxRetriesExceededError" in err.value.error
    assert [r["retries"] for r in seen(redis_client, "b1")] == [0, 1]
    if mode == "worker":
        assert dlq_entry(receipt.task_id).data["exc_type"] == "MaxRetriesExceededError"


def test_retry_with_throw_false_retries_when_the_body_returns(mode, redis_client):
    receipt = bound_tasks.quiet_retry.push("q1")
    assert receipt.get(timeout=60) == "run 2"
    assert [r["fence"] for r in seen(redis_client, "q1")] == [1, 2]


def test_an_async_bound_task_retries_from_apush_in_eager_mode(redis_client):
    async def view() -> Any:
        receipt = await bound_tasks.aretrying.apush("ap1", 1)
        return await receipt.aget(timeout=30)

    with testing.eager():
        assert asyncio.run(view()) == {"retries": 1, "note": "", "fence": 2}
    runs = seen(redis_client, "ap1")
    assert [(r["attempt"], r["fence"], r["is_eager"]) for r in runs] == [(1, 1, True), (2, 2, True)]


@pytest.mark.parametrize(
    "task",
    [bound_tasks.hopeless_retry_on, bound_tasks.autoretry_kwargs],
    ids=["self.retry-exhausted-inside-retry_on", "retry_kwargs-max_retries"],
)
def test_the_retry_limit_holds_whoever_retries(mode, redis_client, task):
    """self.retry()'s exhausted exception is not retried again by retry_on, and
    retry_kwargs' max_retries bounds autoretry_for: retries_exhausted either way."""
    receipt = task.push("lim")
    with pytest.raises(TaskFailed) as err:
        receipt.get(timeout=60)
    assert err.value.reason == "retries_exhausted"
    assert [r["attempt"] for r in seen(redis_client, "lim")] == [1, 2]


def test_parent_id_names_the_step_before_and_expires_the_push_s_expiry(mode, redis_client):
    from celery import chain

    before = datetime.now(UTC)
    chain(bound_tasks.lineage.s(), bound_tasks.lineage.s(), bound_tasks.lineage.s()).apply_async()
    bound_tasks.lineage.apply_async(kwargs={"label": "expiring"}, expires=600)
    steps = wait_until(
        lambda: len(seen(redis_client, "lineage")) == 3 and seen(redis_client, "lineage"),
        30, what="the chain's three steps",
    )  # fmt: skip
    # Celery's parent_id: none for the first step, then the step whose commit made it.
    assert [s["parent_id"] for s in steps] == [None, steps[0]["id"], steps[1]["id"]]
    assert all(s["expires"] is None for s in steps)  # no expires= given
    (expiring,) = wait_until(lambda: seen(redis_client, "expiring"), 30, what="the expiring run")
    expires = datetime.fromisoformat(expiring["expires"])
    assert before + timedelta(seconds=590) < expires < before + timedelta(seconds=620)


def test_a_task_pushed_from_a_task_s_body_names_it_as_its_parent(worker, redis_client):
    spawned = bound_tasks.spawner.push("spawned")
    child = spawned.get(timeout=30)
    (run,) = wait_until(lambda: seen(redis_client, "spawned"), 30, what="the pushed task's run")
    assert run["id"] == child and run["parent_id"] == spawned.task_id
