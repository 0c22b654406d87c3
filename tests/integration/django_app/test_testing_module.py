"""Eager mode and captured pushes (``relier_django.testing``, docs/testing.md): a test
suite's pushes run in its own process, or are recorded, and never reach Redis.

Every test here has the session's private Redis (flushed) as relier's store and
Celery's broker, and ends by asserting it is still empty: no task, claim, result,
DLQ entry or broker message was written, while the task body ran (or was recorded).
The tasks (``demo.in_memory``, ``demo.ain_memory``) record their runs in memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from relier_django import NotDispatched, TaskFailed, testing
from relier_django.core.push.eager import EagerReceipt
from testproject.celery import app as celery_app
from testproject.demo import tasks

# The package's fixtures, as a project's conftest.py would import them.
relier_pushes = testing.relier_pushes
relier_eager = testing.relier_eager
relier_eager_immediate = testing.relier_eager_immediate


@pytest.fixture(autouse=True)
def empty_redis(redis_client) -> Iterator[Any]:
    """The session's Redis, flushed; after the test it must still hold nothing (the
    broker is the same server, so no message was queued either)."""
    tasks.EAGER_RUNS.clear()
    yield redis_client
    assert redis_client.dbsize() == 0, redis_client.keys("*")


@pytest.fixture
def celery_conf() -> Iterator[Any]:
    """Celery's conf, as ``CELERY_TASK_*`` settings set it; restored afterwards."""
    keys = ("task_always_eager", "task_eager_propagates")
    saved = {key: celery_app.conf[key] for key in keys}
    try:
        yield celery_app.conf
    finally:
        celery_app.conf.update(saved)
        testing.reset()


def runs(label: str) -> int:
    return len(tasks.EAGER_RUNS.get(label, []))


def test_celery_task_always_eager_runs_the_task_here_and_leaves_redis_empty(celery_conf):
    celery_conf.task_always_eager = True
    receipt = tasks.in_memory.push("a")
    assert isinstance(receipt, EagerReceipt) and receipt.dispatched and receipt.done
    assert receipt.status == "SUCCESS"  # from memory, not the store
    assert receipt.get(timeout=1) == {"label": "a", "runs": 1, "task_id": receipt.get()["task_id"]}
    assert runs("a") == 1


def test_the_eager_setting_runs_the_task_here(settings):
    settings.RELIER = {**settings.RELIER, "EAGER": True}
    try:
        assert tasks.in_memory.push("b").get() == {
            "label": "b",
            "runs": 1,
            "task_id": tasks.EAGER_RUNS["b"][0]["task_id"],
        }
    finally:
        testing.reset()


def test_eager_runs_log_once_at_debug(relier_eager, caplog):
    logger = logging.getLogger("relier_django")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG, logger="relier_django.eager")
    try:
        receipt = tasks.in_memory.push("log")
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if r.name == "relier_django.eager"]
    assert lines == [f"ran eagerly task=demo.in_memory task_id={receipt.task_id} attempts=1"]


def test_arguments_are_validated_at_push_in_eager_mode(relier_eager):
    with pytest.raises(TypeError, match="unexpected keyword"):
        tasks.in_memory.push("c", colour="red")
    with pytest.raises(TypeError, match="JSON"):
        tasks.in_memory.push({1, 2})
    assert runs("c") == 0


def test_an_idempotent_duplicate_gets_the_first_tasks_id_and_result_and_runs_once(relier_eager):
    first = tasks.in_memory.push("d")
    second = tasks.in_memory.push("d")
    assert second.deduplicated and second.task_id == first.task_id
    assert second.duplicate_of == first.task_id
    assert second.get() == first.get()
    assert runs("d") == 1


def test_a_failure_frees_the_idempotency_key_and_a_later_push_runs_again(relier_eager):
    failed = tasks.in_memory.push("e", error="boom")
    with pytest.raises(TaskFailed):
        failed.get()
    again = tasks.in_memory.push("e", error="boom")
    assert not again.deduplicated and again.task_id != failed.task_id
    assert runs("e") == 2


def test_retry_on_is_retried_inline_up_to_max_retries(relier_eager):
    # demo.in_memory: retry_on=(TimeoutError,), max_retries=2: three runs at most.
    assert tasks.in_memory.push("f", failures=2).get()["runs"] == 3
    exhausted = tasks.in_memory.push("g", failures=5)
    with pytest.raises(TaskFailed) as caught:
        exhausted.get()
    assert caught.value.reason == "retries_exhausted"
    assert caught.value.error == "TimeoutError: run 3 of g timed out"
    assert runs("g") == 3


def test_a_failure_raises_task_failed_from_get_and_files_nothing(relier_eager):
    receipt = tasks.in_memory.push("h", error="cannot process h")
    with pytest.raises(TaskFailed) as caught:
        receipt.get()
    assert receipt.status == "FAILURE"
    assert (caught.value.task_id, caught.value.reason) == (receipt.task_id, "exception")
    assert caught.value.error == "ValueError: cannot process h"
    # empty_redis: no DLQ entry, no result record


def test_task_eager_propagates_raises_the_tasks_exception_from_push(celery_conf):
    celery_conf.task_always_eager = True
    celery_conf.task_eager_propagates = True
    with pytest.raises(ValueError, match="boom"):
        tasks.in_memory.push("i", error="boom")
    with pytest.raises(TimeoutError):
        tasks.in_memory.push("j", failures=5)
    assert runs("j") == 3  # retried first, as without propagation
    # The failure freed the key: the same call runs again.
    assert tasks.in_memory.push("i").get()["runs"] == 2


def test_propagate_in_the_context_manager():
    with testing.eager(propagate=True), pytest.raises(ValueError, match="boom"):
        tasks.in_memory.push("k", error="boom")


def test_an_async_task_runs_from_push_and_from_apush(relier_eager):
    assert tasks.ain_memory.push("l").get() == {"label": "l", "loop": "_UnixSelectorEventLoop"}

    async def from_async_code() -> tuple[Any, Any, bool]:
        receipt = await tasks.ain_memory.apush("m", then="n")
        plain = await tasks.in_memory.apush("o")  # a def task: run off the loop
        return await receipt.aget(timeout=1), await plain.aget(), receipt.dispatched

    result, plain, dispatched = asyncio.run(from_async_code())
    assert result["label"] == "m" and dispatched and plain["runs"] == 1
    assert (runs("l"), runs("m"), runs("n"), runs("o")) == (1, 1, 1, 1)


@pytest.mark.django_db
def test_inside_atomic_the_eager_run_waits_for_the_commit(
    relier_eager, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        receipt = tasks.in_memory.push("p")
        assert receipt.pending and runs("p") == 0
        with pytest.raises(NotDispatched):
            receipt.get()
    assert receipt.dispatched and receipt.get()["runs"] == 1


@pytest.mark.django_db
def test_the_immediate_fixture_runs_a_push_inside_the_tests_transaction_at_once(
    relier_eager_immediate,
):
    # pytest-django's default django_db: the test runs inside a transaction that is
    # rolled back, never committed, so a deferred run would never happen.
    assert transaction.get_connection().in_atomic_block
    receipt = tasks.in_memory.delay("v")
    assert receipt.get(timeout=1)["runs"] == 1 and runs("v") == 1
    with transaction.atomic():
        inner = tasks.in_memory.push("w")
        assert inner.done and runs("w") == 1  # not waiting for the commit


@pytest.mark.django_db
def test_the_eager_immediate_setting_runs_a_push_inside_a_transaction_at_once(settings):
    settings.RELIER = {**settings.RELIER, "EAGER_IMMEDIATE": True}
    try:
        with transaction.atomic():
            receipt = tasks.in_memory.push("x")
            assert receipt.done and receipt.get()["runs"] == 1
    finally:
        testing.reset()


def test_outside_any_transaction_an_eager_push_runs_at_once(relier_eager):
    receipt = tasks.in_memory.push("y")  # no django_db: no transaction at all
    assert receipt.dispatched and receipt.done and runs("y") == 1


def test_capture_records_every_push_and_runs_them_on_demand(relier_pushes):
    first = tasks.in_memory.push("q", failures=1)
    tasks.ain_memory.push_with(on_commit=False).push("r", then="s")
    assert relier_pushes.names == ["demo.in_memory", "demo.ain_memory"]
    pushed = relier_pushes.assert_pushed(tasks.in_memory, "q", failures=1)
    assert (pushed.task_id, pushed.args, pushed.kwargs) == (first.task_id, ("q",), {"failures": 1})
    assert pushed.queue == "" and first.pending and not pushed.ran and first.status == "PENDING"
    with pytest.raises(NotDispatched):
        first.get()
    assert runs("q") == runs("r") == 0
    # The async task pushes demo.in_memory("s") while it runs: captured, then run too.
    receipts = relier_pushes.run_all()
    assert len(receipts) == 3 and relier_pushes.names[-1] == "demo.in_memory"
    assert first.get()["runs"] == 2  # retried once, inline
    assert (runs("q"), runs("r"), runs("s")) == (2, 1, 1)
    relier_pushes.assert_not_pushed(tasks.explode)


def test_capture_validates_at_push_and_wins_over_eager(relier_eager, relier_pushes):
    with pytest.raises(TypeError, match="unexpected keyword"):
        tasks.in_memory.push("t", colour="red")
    receipt = tasks.in_memory.push("t")
    assert receipt.pending and runs("t") == 0 and len(relier_pushes) == 1
    with pytest.raises(AssertionError, match=r"found 0; pushes of it: demo.in_memory\('t'\)$"):
        relier_pushes.assert_pushed(tasks.in_memory, "u")
    relier_pushes[0].run()
    assert receipt.get()["runs"] == 1


def test_a_captured_duplicate_runs_once_and_follows_the_first(relier_pushes):
    one, two = tasks.in_memory.push("v"), tasks.in_memory.push("v")
    relier_pushes.run_all()
    assert two.deduplicated and two.duplicate_of == one.task_id and two.get() == one.get()
    assert runs("v") == 1
