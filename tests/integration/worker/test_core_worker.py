"""The task core end to end on a real worker: sync and async tasks, push and apush,
commit, retries, the DLQ, and the guard rails around Celery's own API."""

from __future__ import annotations

import asyncio
import json

import pytest

from relier_django import TaskFailed
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from tests.leaks import assert_no_leaked_keys

KEYS = KeySpace("rl")


def runs(client, label: str) -> list[str]:
    return [r.decode() for r in client.lrange(f"demo:exec:{label}", 0, -1)]


def test_async_task_commits_and_get_returns_its_result(worker, redis_client):
    receipt = tasks.record.push("a1")
    assert receipt.deduplicated is False
    assert receipt.get(timeout=30) == {"label": "a1", "fence": 1, "runs": 1}
    assert len(runs(redis_client, "a1")) == 1


def test_sync_task_commits(worker, redis_client):
    assert tasks.sync_record.push("s1").get(timeout=30)["runs"] == 1


def test_apush_and_aget_from_async_code(worker, redis_client):
    async def view():
        receipt = await tasks.record.apush("async-1")
        return await receipt.aget(timeout=30)

    assert asyncio.run(view())["label"] == "async-1"


def test_push_inside_a_running_loop_names_apush(redis_client):
    async def view():
        tasks.record.push("x")

    with pytest.raises(RuntimeError, match=r"await record\.apush"):
        asyncio.run(view())
    assert redis_client.dbsize() == 0  # nothing stored


def test_the_published_message_shows_the_arguments_not_the_envelope_twice(redis_client):
    import base64

    receipt = tasks.record.push("shown", sleep_s=0.5)
    (raw,) = redis_client.lrange("celery", 0, -1)
    message = json.loads(raw)
    headers = message["headers"]
    # Monitoring (Flower, events) reads these: the task's own arguments, as Celery
    # would show a plain task's, not the envelope that carries them.
    assert headers["argsrepr"] == "['shown']"
    assert headers["kwargsrepr"] == "{'sleep_s': 0.5}"
    assert headers["id"] == receipt.task_id
    (envelope,), _, _ = json.loads(base64.b64decode(message["body"]))
    assert json.loads(envelope)["args"] == ["shown"]  # the envelope travels once, in the body


def test_retry_on_runs_new_incarnations_with_growing_fences(worker, redis_client):
    result = tasks.flaky.push("f1", 2).get(timeout=30)
    assert result == {"runs": 3, "attempt": 3, "fence": 3}
    assert [r.split(":")[0] for r in runs(redis_client, "f1")] == ["1", "2", "3"]
    assert_no_leaked_keys(redis_client)


def test_retries_exhausted_lands_in_the_dlq_with_history(worker, redis_client):
    receipt = tasks.flaky.push("f2", 99)
    with pytest.raises(TaskFailed) as err:
        receipt.get(timeout=30)
    assert err.value.reason == "retries_exhausted"
    assert len(runs(redis_client, "f2")) == 4  # first run + max_retries=3
    entry = DeadLetterStore(sync_client(config.current()), KEYS).get(receipt.task_id)
    assert entry.data["exc_type"] == "TimeoutError"
    assert [h["event"] for h in entry.history].count("start") == 4
    assert entry.history[-1]["event"] == "dead"


def test_an_exception_goes_to_the_dlq_and_frees_the_idempotency_key(worker, redis_client):
    first = tasks.explode.push("e1")
    with pytest.raises(TaskFailed) as err:
        first.get(timeout=30)
    assert err.value.reason == "exception"
    assert "ValueError: cannot process e1" in err.value.error
    entry = DeadLetterStore(sync_client(config.current()), KEYS).get(first.task_id)
    assert "Traceback" in entry.data["traceback"] and "cannot process e1" in entry.data["traceback"]
    assert entry.data["envelope"]["args"] == ["e1"]
    # The key was released at once: the same push runs again, as a new task.
    second = tasks.explode.push("e1")
    assert second.deduplicated is False and second.task_id != first.task_id
    with pytest.raises(TaskFailed):
        second.get(timeout=30)
    assert len(runs(redis_client, "e1")) == 2
    assert_no_leaked_keys(redis_client)


def test_a_result_that_is_not_json_lands_in_the_dlq(worker, redis_client):
    with pytest.raises(TaskFailed) as err:
        tasks.unserializable.push("u1").get(timeout=30)
    assert err.value.reason == "result_not_serializable"


MIB = 1_048_576


def test_a_result_above_result_max_bytes_is_dead_lettered_at_once_its_body_run_once(
    worker_factory, redis_client, settings
):
    # 1 MiB, the default, set here as an operator would: the worker reads the setting.
    settings.RELIER = {**settings.RELIER, "RESULT_MAX_BYTES": MIB}
    worker_factory(extra_env={"RELIER_RESULT_MAX_BYTES": str(MIB)})
    with pytest.raises(TaskFailed) as err:
        tasks.big_result.push("big", 2 * MIB).get(timeout=30)
    task_id = err.value.task_id
    assert err.value.reason == "result_too_large"
    entry = DeadLetterStore(sync_client(config.current()), KEYS).get(task_id)
    assert entry.summary.reason == "result_too_large" and entry.summary.fence == 1
    assert entry.data["exc_type"] == "ResultTooLarge"
    error = entry.data["exc_message"]
    # The record names its push's 16-hex-digit token (outcome.succeeded).
    record_bytes = 2 * MIB + len('{"fence":1,"push":"0123456789abcdef","result":"","status":"ok"}')
    assert f"takes {record_bytes} bytes" in error and f"RESULT_MAX_BYTES ({MIB})" in error
    assert "settings.RELIER['RESULT_MAX_BYTES']" in error
    # Its body ran once, and nothing is left that could run it again: no task to
    # resurrect, no message, no result stored.
    assert len(runs(redis_client, "big")) == 1
    assert not redis_client.exists(KEYS.task(task_id))
    assert json.loads(redis_client.get(KEYS.result(task_id)))["status"] == "failed"
    # Just under the bound, the record's own bytes counted: committed, once.
    fits = tasks.big_result.push("fits", MIB - 64).get(timeout=30)
    assert len(fits) == MIB - 64 and len(runs(redis_client, "fits")) == 1


def test_same_arguments_on_two_tasks_never_share_a_result(worker, redis_client):
    a = tasks.charge.push("o-1", 10)
    b = tasks.refund.push("o-1", 10)
    assert a.task_id != b.task_id and not b.deduplicated
    assert a.get(timeout=30)["task_id"] == a.task_id
    assert b.get(timeout=30) == {"refunded": "o-1", "task_id": b.task_id}


def test_an_unknown_task_name_goes_to_the_dlq_and_never_runs(worker, redis_client):
    from relier_django.core.model.spec import TaskSpec
    from relier_django.core.push import producer
    from testproject.celery import app

    ghost = TaskSpec(name="demo.ghost", fn=lambda label: None)
    receipt = producer.push(ghost, app, ("g",), {})
    with pytest.raises(TaskFailed) as err:
        receipt.get(timeout=30)
    assert err.value.reason == "unknown_task"


def test_a_tampered_message_is_dead_lettered_with_its_raw_body_and_never_runs(worker, redis_client):
    from relier_django.core.push import producer
    from testproject.celery import app

    env = producer.prepare(tasks.record.relier_spec, ("t1",), {})
    body = json.loads(env.encode())
    body["args"] = ["t1-tampered"]
    raw = json.dumps(body)
    app.send_task("demo.record", args=[raw], serializer="json")
    client = sync_client(config.current())

    def dead() -> list:
        return list(DeadLetterStore(client, KEYS).iter())

    from testproject.harness import wait_until

    entries = wait_until(dead, 30, what="the DLQ entry")
    assert entries[0].reason == "payload_integrity"
    assert entries[0].data["raw"] == raw
    assert runs(redis_client, "t1-tampered") == [] and runs(redis_client, "t1") == []


def test_a_message_not_sent_by_push_whose_arguments_do_not_fit_is_kept_in_the_dlq(
    worker, redis_client
):
    """A plain Celery message for an @rl_task is adopted by the worker (send_task by
    name, tests/chaos/test_send_task.py); one whose arguments do not fit the task's
    signature is dead-lettered there, never lost and never run."""
    from testproject.celery import app
    from testproject.harness import wait_until

    app.send_task("demo.record", args=["a", 0, "extra"], serializer="json")
    client = sync_client(config.current())
    store = DeadLetterStore(client, KEYS)
    entries = wait_until(lambda: list(store.iter()), 30, what="the DLQ entry")
    assert entries[0].reason == "schema_migration"
    assert not redis_client.exists("demo:exec:a")
