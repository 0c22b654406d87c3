"""G5/G6 for plain ``def`` tasks under Celery's time limits, with real prefork workers.

The hard limit kills the pool process; the worker's main process dead-letters the
task it stopped at once (reason ``hard_timeout``, its checkpoint and history in the
entry), and it is never resurrected for it. Each worker here has a heartbeat TTL of a
minute, so a task that reached the DLQ within seconds did not get there through a
heartbeat's expiry and a resurrection. A soft limit the task lets escape is
dead-lettered the same way, unless ``retry_on`` names it.
"""

from __future__ import annotations

import time

import pytest

from relier_django import TaskFailed
from relier_django import dlq as django_dlq
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks

KEYS = KeySpace("rl")
LONG_TTL = {"RELIER_HEARTBEAT_TTL_S": "60", "RELIER_SCAN_INTERVAL_S": "0.5"}


def _client():  # type: ignore[no-untyped-def]
    return sync_client(config.current())


def _fails_within(receipt, seconds: float) -> TaskFailed:  # type: ignore[no-untyped-def]
    began = time.monotonic()
    with pytest.raises(TaskFailed) as failed:
        receipt.get(timeout=seconds)
    assert time.monotonic() - began < seconds
    return failed.value


def _filed_once_never_resurrected(task_id: str, label: str) -> None:
    client = _client()
    entry = django_dlq.store().get(task_id)
    assert entry.reason == "hard_timeout"
    assert int(client.hget(KEYS.dlq_entry(task_id), "failures")) == 1
    events = [e["event"] for e in entry.history]
    assert events.count("start") == 1 and "expired" not in events, events
    assert client.zscore(KEYS.expiry, task_id) is None  # nothing left to resurrect
    time.sleep(1.5)  # three scans: nothing comes back
    assert client.llen(f"demo:exec:{label}") == 1


def test_a_def_task_past_its_hard_timeout_is_dead_lettered_at_once_with_its_checkpoint(
    worker_factory, redis_client
):
    worker = worker_factory(extra_env=LONG_TTL)
    receipt = tasks.def_hangs.push("hangs", hang_s=30)
    failed = _fails_within(receipt, 15)  # hard_timeout is 1.5 s; the TTL 60 s
    assert failed.reason == "hard_timeout"
    entry = django_dlq.store().get(receipt.task_id)
    assert entry.data["exc_type"] == "TimeLimitExceeded"
    assert "hard time limit (1.5 s)" in entry.data["exc_message"]
    assert entry.checkpoint == {"label": "hangs", "soft": True}  # saved at the soft limit
    _filed_once_never_resurrected(receipt.task_id, "hangs")
    assert "dead-lettered reason=hard_timeout" in worker.log_text()


def test_a_soft_time_limit_the_def_task_lets_escape_is_dead_lettered_not_retried(
    worker_factory, redis_client
):
    worker_factory(extra_env=LONG_TTL)
    receipt = tasks.def_soft_escape.push("escapes", hang_s=30)
    failed = _fails_within(receipt, 8)  # soft 0.5 s, hard 10 s: the soft limit decides
    assert failed.reason == "hard_timeout"
    entry = django_dlq.store().get(receipt.task_id)
    assert entry.data["exc_type"] == "SoftTimeLimitExceeded"
    assert "SoftTimeLimitExceeded" in entry.data["traceback"]
    assert entry.checkpoint == {"label": "escapes"}
    _filed_once_never_resurrected(receipt.task_id, "escapes")


def test_a_soft_time_limit_named_in_retry_on_is_retried_then_exhausted(
    worker_factory, redis_client
):
    worker_factory(extra_env=LONG_TTL)
    receipt = tasks.def_soft_retried.push("retried", hang_s=30)
    failed = _fails_within(receipt, 15)
    assert failed.reason == "retries_exhausted"
    assert _client().llen("demo:exec:retried") == 2  # max_retries=1: two attempts


def test_the_workers_time_limit_flag_dead_letters_a_relier_task_without_limits_of_its_own(
    worker_factory, redis_client
):
    worker_factory(extra_env=LONG_TTL, extra_args=("--time-limit", "1.5"))
    receipt = tasks.work.push("flag", sleep_s=30)
    failed = _fails_within(receipt, 15)
    assert failed.reason == "hard_timeout"
    assert _client().llen("demo:start:flag") == 1
    entry = django_dlq.store().get(receipt.task_id)
    assert "hard time limit (1.5 s)" in entry.data["exc_message"]
    assert int(_client().hget(KEYS.dlq_entry(receipt.task_id), "failures")) == 1
    assert _client().zscore(KEYS.expiry, receipt.task_id) is None
    time.sleep(1.5)
    assert _client().llen("demo:start:flag") == 1  # one execution, never resurrected


def test_the_workers_soft_time_limit_flag_dead_letters_a_def_task_that_lets_it_escape(
    worker_factory, redis_client
):
    worker_factory(extra_env=LONG_TTL, extra_args=("--soft-time-limit", "0.5"))
    receipt = tasks.work.push("soft-flag", sleep_s=30)
    failed = _fails_within(receipt, 15)
    assert failed.reason == "hard_timeout"
    assert django_dlq.store().get(receipt.task_id).data["exc_type"] == "SoftTimeLimitExceeded"
    assert _client().llen("demo:start:soft-flag") == 1


def test_the_workers_time_limit_flag_kills_an_async_task_too_and_dead_letters_it(
    worker_factory, redis_client
):
    worker_factory(extra_env=LONG_TTL, extra_args=("--time-limit", "1.5"))
    receipt = tasks.record.push("async-flag", sleep_s=30)
    failed = _fails_within(receipt, 15)
    assert failed.reason == "hard_timeout"
    assert _client().zscore(KEYS.expiry, receipt.task_id) is None


def test_the_workers_soft_time_limit_flag_stops_an_async_task_and_dead_letters_it(
    worker_factory, redis_client
):
    # Celery raises the soft limit in the pool thread waiting for the coroutine: the
    # incarnation is stopped there and filed, never left running to commit later.
    worker_factory(extra_env=LONG_TTL, extra_args=("--soft-time-limit", "0.5"))
    receipt = tasks.record.push("async-soft-flag", sleep_s=5)
    failed = _fails_within(receipt, 15)
    assert failed.reason == "hard_timeout"
    assert django_dlq.store().get(receipt.task_id).data["exc_type"] == "SoftTimeLimitExceeded"
    time.sleep(5.5)  # past the sleep it would have finished: it never ran to the end
    assert _client().llen("demo:exec:async-soft-flag") == 0
    assert _client().get(KEYS.result(receipt.task_id)) is not None  # the failure, once
