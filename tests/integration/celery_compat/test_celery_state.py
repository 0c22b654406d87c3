"""Celery tells the truth about relier's tasks (issue 20).

With real workers: Celery's signals see the way relier settled each message (a
committed result is SUCCESS with that result, a dead-letter FAILURE with the task's
own exception, a retry RETRY, a stale copy IGNORED), the message is never redelivered
for it, and ``AsyncResult(id)`` read in this process (another process than the
worker) through ``relier_django.results:RelierBackend`` reports SUCCESS, FAILURE,
STARTED and PENDING from relier's store, handing other tasks to a fallback backend.

The worker records what its Celery signals saw (``DEMO_RECORD_CELERY_SIGNALS``, see
the end of testproject/demo/tasks.py) under ``demo:celery:<task_id>``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

import relier_django
from relier_django import DuplicateTaskId, TaskFailed
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import CeleryWorker, wait_until

KEYS = KeySpace("rl")
RECORD = {"DEMO_RECORD_CELERY_SIGNALS": "1"}
BACKEND = "relier_django.results:RelierBackend"


def seen(client: redis.Redis, task_id: str) -> list[dict[str, Any]]:
    return [json.loads(e) for e in client.lrange(f"demo:celery:{task_id}", 0, -1)]


def postruns(client: redis.Redis, task_id: str) -> list[str]:
    return [e["state"] for e in seen(client, task_id) if e["signal"] == "postrun"]


def signals_of(client: redis.Redis, task_id: str) -> list[str]:
    return [e["signal"] for e in seen(client, task_id) if e["signal"] != "postrun"]


def settled(client: redis.Redis, task_id: str, count: int = 1) -> list[dict[str, Any]]:
    """What Celery saw of ``task_id``, once ``count`` runs of it have ended."""
    wait_until(lambda: len(postruns(client, task_id)) >= count, 30, what=f"{count} postrun(s)")
    return seen(client, task_id)


def use_backend(name: str | None) -> str | None:
    """Point this process's Celery app at the result backend ``name``; the one before."""
    before = app.conf.result_backend
    app.conf.result_backend = name
    app._backend_cache = None  # Celery keeps the backend built: drop it
    vars(app._local).pop("backend", None)
    return before


@pytest.fixture
def recording(worker_factory: Callable[..., CeleryWorker]) -> CeleryWorker:
    return worker_factory(extra_env=RECORD)


@pytest.fixture
def relier_results(settings: Any, redis_server: Any) -> Iterator[Any]:
    """This process's Celery app reading results through RelierBackend, its fallback a
    second database of the private Redis."""
    fallback = redis_server.url.rsplit("/", 1)[0] + "/1"
    settings.RELIER = {**settings.RELIER, "RESULT_BACKEND_FALLBACK": fallback}
    before = use_backend(BACKEND)
    try:
        yield fallback
    finally:
        use_backend(before)


def test_a_committed_task_is_celery_success_with_its_result(recording, redis_client):
    for task in (tasks.sync_record, tasks.record):
        receipt = task.push(f"ok-{task.name}")
        result = receipt.get(timeout=30)
        events = settled(redis_client, receipt.task_id)
        assert signals_of(redis_client, receipt.task_id) == ["success"]
        assert events[0]["result"] == result  # the task's own return value
        assert postruns(redis_client, receipt.task_id) == ["SUCCESS"]


def test_a_dead_lettered_task_is_celery_failure_with_its_own_exception(recording, redis_client):
    for task, exc_type in ((tasks.explode, "ValueError"), (tasks.afails, "DemoError")):
        receipt = task.push(f"boom-{task.name}")
        with pytest.raises(TaskFailed):
            receipt.get(timeout=30)
        (failure,) = [e for e in settled(redis_client, receipt.task_id) if e["signal"] != "postrun"]
        assert failure["signal"] == "failure" and failure["type"] == exc_type
        assert failure["has_traceback"] and f"boom-{task.name}" in failure["message"]
        assert postruns(redis_client, receipt.task_id) == ["FAILURE"]
    log = recording.log_text()
    # relier's ERROR line carries the task's traceback; Celery no longer says "succeeded".
    line = log.index("dead-lettered task_id=")
    assert "Traceback (most recent call last)" in log[line : line + 3000]
    assert " succeeded in " not in log


def test_a_dead_letter_without_an_exception_is_celery_failure_with_task_failed(
    recording, redis_client
):
    receipt = tasks.unserializable.push("not-json")
    (failure,) = [e for e in settled(redis_client, receipt.task_id) if e["signal"] != "postrun"]
    assert (failure["type"], failure["module"]) == ("TaskFailed", "relier_django.core.model.errors")
    assert failure["reason"] == "result_not_serializable"
    assert postruns(redis_client, receipt.task_id) == ["FAILURE"]


def test_a_retried_task_is_celery_retry_and_celery_publishes_nothing_itself(
    recording, redis_client
):
    receipt = tasks.flaky.push("flaky-2", 2)
    assert receipt.get(timeout=30)["runs"] == 3
    settled(redis_client, receipt.task_id, count=3)
    events = [e for e in seen(redis_client, receipt.task_id) if e["signal"] != "postrun"]
    assert [(e["signal"], e.get("type")) for e in events] == [
        ("retry", "TimeoutError"), ("retry", "TimeoutError"), ("success", None),
    ]  # fmt: skip
    assert all(e["when"] is not None for e in events[:2])  # relier's backoff, in seconds
    # Only relier's incarnations ran: no extra message (Celery's own retry would be one,
    # and would show up here as an IGNORED copy or a fourth run).
    assert postruns(redis_client, receipt.task_id) == ["RETRY", "RETRY", "SUCCESS"]
    assert redis_client.llen("demo:exec:flaky-2") == 3


def test_a_stale_copy_of_a_finished_task_is_ignored_without_a_failure_signal(
    worker_factory, redis_client
):
    receipt = tasks.sync_record.push("copied")
    raw = wait_until(lambda: redis_client.lindex("celery", 0), 10, what="the queued message")
    worker = worker_factory(extra_env=RECORD)
    receipt.get(timeout=30)
    redis_client.lpush("celery", raw)  # the very bytes again: a duplicate delivery
    settled(redis_client, receipt.task_id, count=2)
    assert postruns(redis_client, receipt.task_id) == ["SUCCESS", "IGNORED"]
    assert signals_of(redis_client, receipt.task_id) == ["success"]  # no failure
    assert redis_client.llen("demo:exec:copied") == 1
    assert redis_client.zcard(KEYS.dlq) == 0
    assert "message refused task_id=" + receipt.task_id in worker.log_text()


@pytest.mark.parametrize(
    "transport", ["relier_django.transport:Transport", "redis"], ids=["relier", "kombu"]
)
def test_failed_retried_and_ignored_messages_are_never_redelivered(
    transport, worker_factory, redis_client
):
    done = tasks.sync_record.push("dup")
    raw = wait_until(lambda: redis_client.lindex("celery", 0), 10, what="the queued message")
    worker_factory(
        extra_env={
            **RECORD,
            "CELERY_BROKER_TRANSPORT": transport,
            "CELERY_TASK_ACKS_LATE": "true",
            "CELERY_VISIBILITY_TIMEOUT": "2",  # an unacked copy would come back at once
            "CELERY_UNACKED_RESTORE_INTERVAL": "0.5",
        }
    )
    dead = tasks.explode.push("never-again")
    retried = tasks.flaky.push("retried-once", 1)
    done.get(timeout=30)
    redis_client.lpush("celery", raw)  # a stale copy: IGNORED, acknowledged all the same
    with pytest.raises(TaskFailed):
        dead.get(timeout=30)
    retried.get(timeout=30)
    asyncio.run(asyncio.sleep(4))  # two visibility timeouts
    assert redis_client.llen("demo:exec:never-again") == 1
    assert redis_client.llen("demo:exec:retried-once") == 2
    assert postruns(redis_client, dead.task_id) == ["FAILURE"]
    assert postruns(redis_client, retried.task_id) == ["RETRY", "SUCCESS"]
    assert postruns(redis_client, done.task_id) == ["SUCCESS", "IGNORED"]
    assert redis_client.llen("demo:exec:dup") == 1
    assert redis_client.hlen("unacked") == 0


def test_async_result_in_another_process_reads_relier_outcomes(
    relier_results, worker, redis_client
):
    ok = tasks.sync_record.push("ar-ok")
    assert AsyncResult(ok.task_id).get(timeout=30)["label"] == "ar-ok"
    same = app.AsyncResult(ok.task_id)
    assert (same.state, same.result["label"], same.successful()) == ("SUCCESS", "ar-ok", True)

    dead = tasks.explode.push("ar-boom")
    with pytest.raises(TaskFailed) as raised:
        AsyncResult(dead.task_id).get(timeout=30)
    assert raised.value.reason == "exception"
    assert raised.value.error == "ValueError: cannot process ar-boom"
    failed = AsyncResult(dead.task_id)
    assert failed.state == "FAILURE" and isinstance(failed.result, TaskFailed)
    assert "ValueError: cannot process ar-boom" in failed.traceback
    assert failed.date_done is not None

    slow = tasks.sync_record.push("ar-slow", sleep_s=3)
    wait_until(lambda: AsyncResult(slow.task_id).state == "STARTED", 20, what="STARTED")
    assert AsyncResult(slow.task_id).result["hostname"].startswith(worker.hostname)
    assert AsyncResult("no-such-task").state == "PENDING"
    assert AsyncResult(slow.task_id).get(timeout=30)["label"] == "ar-slow"


def test_other_celery_tasks_results_go_to_the_fallback_backend(
    relier_results, worker_factory, redis_client
):
    worker_factory(
        extra_env={
            "CELERY_RESULT_BACKEND": BACKEND,
            "RELIER_RESULT_BACKEND_FALLBACK": relier_results,
        }
    )
    plain = tasks.plain_record.apply_async(("plain-ok",), ignore_result=False)
    assert AsyncResult(plain.id).get(timeout=30) == "plain-ok"
    assert AsyncResult(plain.id).state == "SUCCESS"
    # relier's own tasks, through the same backend, still read relier's store.
    assert AsyncResult(tasks.sync_record.push("mixed").task_id).get(timeout=30)["runs"] == 1
    assert not redis_client.keys("celery-task-meta-*")  # nothing of Celery's in db 0


def test_without_a_fallback_other_tasks_results_are_dropped_with_a_warning(
    settings, worker_factory, redis_client
):
    worker = worker_factory(extra_env={"CELERY_RESULT_BACKEND": BACKEND})
    plain = tasks.plain_record.apply_async(("dropped",), ignore_result=False)
    wait_until(lambda: redis_client.get("demo:plain:dropped"), 30, what="the plain task ran")
    wait_until(lambda: "result dropped task=demo.plain_record" in worker.log_text(), 10)
    before = use_backend(BACKEND)
    try:
        assert AsyncResult(plain.id).state == "PENDING"
    finally:
        use_backend(before)


def test_receipts_answer_to_celerys_names_and_result_reads_any_task_id(worker, redis_client):
    receipt = tasks.sync_record.push("by-id")
    assert receipt.id == receipt.task_id
    assert receipt.get(timeout=30)["label"] == "by-id"
    assert receipt.status == "SUCCESS"
    again = relier_django.result(receipt.task_id)
    assert again.get(timeout=5)["label"] == "by-id" and again.status == "SUCCESS"

    async def read() -> tuple[Any, str]:
        other = await relier_django.aresult(receipt.task_id)
        return await other.aget(timeout=5), await other.astatus()

    assert asyncio.run(read())[1] == "SUCCESS"
    # The hint of a reused id names a call that works.
    with pytest.raises(DuplicateTaskId, match=r"relier_django\.result\(task_id\)\.get\(\)"):
        tasks.sync_record.apply_async(("by-id",), task_id=receipt.task_id)
    assert relier_django.result("never-pushed").status == "PENDING"


def test_a_receipts_state_and_failed_mean_what_celerys_do(worker, redis_client):
    """``state`` is Celery's (the task's), ``failed()`` a method, as on ``AsyncResult``;
    the push's own stage is ``dispatch_state`` and ``send_failed`` (issue 36)."""
    done = tasks.sync_record.push("celery-names")
    done.get(timeout=30)
    assert (done.state, done.successful(), done.failed(), done.ready()) == (
        "SUCCESS", True, False, True,
    )  # fmt: skip
    assert done.dispatch_state == "dispatched" and not done.send_failed
    broken = tasks.explode.push("celery-names-broken")
    wait_until(lambda: broken.ready(), 30, what="the broken task in the DLQ")
    assert (broken.state, broken.failed(), broken.successful()) == ("FAILURE", True, False)
    waiting = tasks.sync_record.push_with(countdown=60).push("celery-names-later")
    assert (waiting.state, waiting.ready(), waiting.failed()) == ("PENDING", False, False)
