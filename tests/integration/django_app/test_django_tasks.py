"""django.tasks on relier (issue 24): Django's own @task API, run by real Celery workers
through relier_django.tasks.RelierBackend, with relier's guarantees.

The tasks are testproject/demo/jobs.py's; the test process enqueues and reads results,
a worker (another process) runs them. The kill test is in tests/chaos.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import jobs
from testproject.harness import wait_until

try:
    from django.tasks import TaskResultStatus, default_task_backend
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskResultStatus, default_task_backend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist

KEYS = KeySpace("rl")
S = TaskResultStatus


def _finished(result: Any, timeout_s: float = 30) -> Any:
    def done() -> bool:
        result.refresh()
        return bool(result.is_finished)

    wait_until(done, timeout_s, what=f"task {result.id} to finish")
    return result


def _lines(path: Path) -> list[dict[str, Any]]:
    """Django's task signals in the log (relier's own are logged there too)."""
    if not path.exists():
        return []
    found = [json.loads(x) for x in path.read_text().splitlines()]
    return [x for x in found if x["signal"] in {"task_enqueued", "task_started", "task_finished"}]


def test_the_backend_says_what_it_supports():
    from relier_django.tasks import RelierBackend

    backend = jobs.add.get_backend()
    assert isinstance(backend, RelierBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority
    with pytest.raises(InvalidTask):  # Django's own validation: -100..100
        jobs.add.using(priority=101)
    with pytest.raises(InvalidTask):
        jobs.add.using(queue_name="nowhere")


def test_enqueue_runs_on_a_worker_and_the_value_is_read_back(worker, redis_client):
    result = jobs.add.enqueue(2, 3)
    assert result.status == S.READY and result.args == [2, 3] and result.enqueued_at
    _finished(result)
    assert result.status == S.SUCCESSFUL and result.return_value == 5
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert worker.hostname in result.worker_ids[0]
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at
    assert result.started_at <= result.finished_at
    again = jobs.add.get_result(result.id)  # a fresh read, as another process would
    assert (again.status, again.return_value, again.args) == (S.SUCCESSFUL, 5, [2, 3])


def test_a_tuple_comes_back_as_django_keeps_it(worker):
    result = _finished(jobs.pair.enqueue("dt-pair"))
    assert result.return_value[0] == "dt-pair" and isinstance(result.return_value, list)


def test_an_async_task_runs_on_the_workers_loop(worker):
    result = _finished(jobs.double.enqueue(21))
    assert result.return_value == 42


def test_a_raising_task_is_failed_with_its_error_and_in_the_dlq(worker, redis_client):
    result = _finished(jobs.explode.enqueue("dt-boom"))
    assert result.status == S.FAILED
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018 - Django's property raises for a failed task
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert "boom dt-boom" in error.traceback and "Traceback" in error.traceback
    entry = DeadLetterStore(sync_client(config.current()), KEYS).get(result.id)
    assert entry is not None and entry.reason == "exception"
    assert redis_client.llen("demo:exec:dt-boom") == 1


def test_a_released_dlq_entry_runs_again_and_succeeds(worker, redis_client):
    result = _finished(jobs.until_fixed.enqueue("dt-fix"))
    assert result.status == S.FAILED
    redis_client.set("demo:fixed:dt-fix", "1")
    call_command("relier_dlq", "release", result.id)
    wait_until(lambda: jobs.until_fixed.get_result(result.id).status == S.SUCCESSFUL, 30)
    done = jobs.until_fixed.get_result(result.id)
    assert done.return_value == "fixed" and done.attempts == 2


def test_takes_context_gives_the_attempt_and_the_result(worker):
    result = _finished(jobs.whoami.enqueue("dt-ctx"))
    seen = result.return_value
    assert seen["id"] == result.id and seen["attempt"] == 1
    assert seen["workers"] == result.worker_ids


def test_relier_options_come_through_task(worker, redis_client):
    result = _finished(jobs.charge.enqueue("dt-order-1", failures=2))
    assert result.status == S.SUCCESSFUL and result.return_value["runs"] == 3
    assert result.attempts == 3  # two retries: each a fenced incarnation of its own
    duplicate = jobs.charge.enqueue("dt-order-1", failures=2)  # idempotent: same key
    assert duplicate.id == result.id and duplicate.status == S.SUCCESSFUL
    assert redis_client.llen("demo:exec:dt-order-1") == 3


def test_flow_control_comes_through_task_and_using(worker_factory, redis_client):
    """``@task(concurrency=1, concurrency_key="key")`` and, for a task with none,
    ``using(limit="single", concurrency_key=...)``: one run of a key at a time, in
    enqueue order, on a worker of 4 processes (docs/flow-control.md)."""
    from tests.integration.test_limits import _most_at_once, _no_limit_keys_left, _records

    worker_factory(concurrency=4)
    results = [jobs.one_per_key.enqueue("a", f"a{i}", 0.1) for i in range(3)]
    per_call = jobs.unlimited.using(limit="single", concurrency_key="b")
    results += [per_call.enqueue("b", f"b{i}", 0.1) for i in range(3)]
    for each in results:
        assert _finished(each).status == S.SUCCESSFUL
    records = _records(redis_client, "dj")
    assert _most_at_once(records) == {"a": 1, "b": 1}
    starts = [label for kind, _, label, _, _ in records if kind == "start"]
    assert [x for x in starts if x[0] == "a"] == ["a0", "a1", "a2"]
    assert [x for x in starts if x[0] == "b"] == ["b0", "b1", "b2"]
    _no_limit_keys_left(redis_client)
    with pytest.raises(TypeError, match="takes the key itself"):
        jobs.unlimited.using(limit="single", concurrency_key=1.5)


def test_run_after_waits_in_the_durable_schedule(worker, redis_client):
    due = timezone.now() + timedelta(seconds=2)
    result = jobs.add.using(run_after=due).enqueue(1, 1)
    assert redis_client.zscore(KEYS.schedule, result.id) is not None
    time.sleep(0.5)
    result.refresh()
    assert result.status == S.READY and not result.worker_ids
    _finished(result)
    assert result.started_at >= due and result.return_value == 2


def test_an_unknown_id_does_not_exist(redis_client):
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_result("no-such-task")
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(default_task_backend.aget_result("no-such-task"))


def test_an_rl_task_id_is_not_a_django_task_result(worker):
    from testproject.demo import tasks

    receipt = tasks.sync_record.push("dt-not-mine")
    receipt.get(timeout=30)
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(receipt.task_id)


@pytest.mark.django_db(transaction=True)
def test_inside_atomic_it_is_sent_at_the_commit_and_never_on_a_rollback(worker, redis_client):
    with transaction.atomic():
        result = jobs.add.enqueue(4, 4)
        assert redis_client.exists(KEYS.task(result.id)) == 0  # not yet: at the commit
    _finished(result)
    assert result.return_value == 8
    with pytest.raises(RuntimeError), transaction.atomic():
        dropped = jobs.add.enqueue(5, 5)
        raise RuntimeError("roll back")
    time.sleep(0.5)
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_result(dropped.id)


def test_aenqueue_and_aget_result(worker):
    async def go() -> Any:
        result = await jobs.double.aenqueue(5)
        for _ in range(300):
            await result.arefresh()
            if result.is_finished:
                return result
            await asyncio.sleep(0.1)
        raise AssertionError("not finished")

    assert asyncio.run(go()).return_value == 10


def test_djangos_signals_are_sent_where_each_step_happens(worker_factory, tmp_path, monkeypatch):
    log = tmp_path / "signals.jsonl"
    monkeypatch.setenv("DEMO_SIGNAL_LOG", str(log))  # this process: task_enqueued
    worker = worker_factory(extra_env={"DEMO_SIGNAL_LOG": str(log)})
    ok = _finished(jobs.add.enqueue(1, 2))
    failed = _finished(jobs.explode.enqueue("dt-sig"))
    wait_until(lambda: len(_lines(log)) >= 6, 10, what="six signals")
    time.sleep(0.5)  # and no more
    seen = {(x["signal"], x["id"]): x for x in _lines(log)}
    assert len(_lines(log)) == 6, _lines(log)
    for result, final in ((ok, "SUCCESSFUL"), (failed, "FAILED")):
        assert seen["task_enqueued", result.id]["status"] == "READY"
        assert seen["task_started", result.id]["status"] == "RUNNING"
        assert seen["task_finished", result.id]["status"] == final
        assert seen["task_finished", result.id]["pid"] != seen["task_enqueued", result.id]["pid"]
    assert worker.process is not None


def test_check_reports_a_misconfigured_backend(settings):
    settings.TASKS = {
        "default": {
            "BACKEND": "relier_django.tasks.RelierBackend",
            "OPTIONS": {"USING": "nope", "PRIORITY": 1},
        }
    }
    from django.core.checks import run_checks

    ids = {m.id for m in run_checks()}
    assert {"relier.E011", "relier.E012"} <= ids


def test_relier_eager_mode_runs_a_django_task_at_enqueue_and_keeps_no_result(redis_client):
    from relier_django import testing

    with testing.eager():
        result = jobs.pair.enqueue("dt-eager")
    assert redis_client.llen("demo:exec:dt-eager") == 1  # ran here, at enqueue
    assert redis_client.exists(KEYS.task(result.id)) == 0
    with pytest.raises(TaskResultDoesNotExist):
        result.refresh()
