"""``send_task`` by name with raw arguments (issue 39): a worker adopts Celery's own
message for an ``@rl_task`` (docs/from-celery.md, docs/api.md "Sending by name").

Real workers on the private Redis. Each test sends Celery's plain message (arguments,
no envelope) as ``app.send_task("demo.sync_record", ...)`` would from code that does
not import the task, and proves what a pushed task has from adoption on: it runs and
commits once, its outcome is read by id, a second delivery of the same bytes runs
nothing more, and a worker SIGKILLed while running it does not lose it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

import relier_django
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.harness import wait_until

KEYS = KeySpace("rl")


@pytest.fixture
def client(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    yield sync_client(config.current())


def executions(client: redis.Redis, label: str) -> list[str]:
    return list(client.lrange(f"demo:exec:{label}", 0, -1))


def test_send_task_by_name_runs_once_committed_and_readable_by_id(worker_factory, client):
    worker = worker_factory()
    sent = app.send_task("demo.sync_record", args=["by-name"], kwargs={"sleep_s": 0.1})
    result = relier_django.result(sent.id).get(timeout=60)
    assert result == {"label": "by-name", "fence": 1, "runs": 1}
    assert len(executions(client, "by-name")) == 1
    assert client.exists(KEYS.result(sent.id))  # its outcome, stored under the Celery id
    assert client.zcard(KEYS.dlq) == 0
    assert "malformed_message" not in worker.log_text()


def test_an_async_task_sent_by_name_with_positional_arguments_runs(worker_factory, client):
    worker_factory()
    sent = app.send_task("demo.record", args=["async-by-name", 0])
    assert relier_django.result(sent.id).get(timeout=60)["runs"] == 1
    assert len(executions(client, "async-by-name")) == 1


def test_the_same_raw_message_delivered_twice_runs_once(worker_factory, client, redis_client):
    # The very bytes of one message, taken off a queue no worker consumes, delivered
    # twice: a broker redelivery, or a copy reaching a second worker.
    task_id = uuid.uuid4().hex
    app.send_task("demo.sync_record", args=["twice"], task_id=task_id, queue="parked")
    raw = wait_until(lambda: redis_client.rpop("parked"), 10, what="the message")
    worker_factory(name="a", queues=("a",))
    worker_factory(name="b", queues=("b",))
    redis_client.lpush("a", raw)
    assert relier_django.result(task_id).get(timeout=60)["runs"] == 1
    redis_client.lpush("b", raw)  # after the commit: its outcome is kept
    redis_client.lpush("a", raw)
    wait_until(lambda: redis_client.llen("a") == redis_client.llen("b") == 0, 30,
               what="both copies taken")  # fmt: skip
    assert len(executions(client, "twice")) == 1
    assert client.zcard(KEYS.dlq) == 0


def test_two_copies_at_once_run_once(worker_factory, client, redis_client):
    task_id = uuid.uuid4().hex
    app.send_task("demo.sync_record", args=["together"], kwargs={"sleep_s": 2.0},
                  task_id=task_id, queue="parked")  # fmt: skip
    raw = wait_until(lambda: redis_client.rpop("parked"), 10, what="the message")
    worker_factory(name="a", queues=("a",))
    worker_factory(name="b", queues=("b",))
    redis_client.lpush("a", raw)
    redis_client.lpush("b", raw)
    assert relier_django.result(task_id).get(timeout=60)["runs"] == 1
    assert len(executions(client, "together")) == 1
    assert client.zcard(KEYS.dlq) == 0


def test_an_adopted_task_survives_the_sigkill_of_its_worker(worker_factory, client):
    first = worker_factory(name="first")
    sent = app.send_task("demo.sync_record", args=["killed"], kwargs={"sleep_s": 3.0})
    wait_until(lambda: client.hget(KEYS.task(sent.id), "state") == "running", 30,
               what="the adopted task to run")  # fmt: skip
    first.kill()
    worker_factory(name="second")
    result = relier_django.result(sent.id).get(timeout=90)
    assert result["fence"] >= 2 and result["runs"] == 1  # the resurrected incarnation
    assert [entry.split(":")[0] for entry in executions(client, "killed")] == [str(result["fence"])]
    assert client.zcard(KEYS.dlq) == 0


def test_arguments_that_do_not_fit_the_signature_land_in_the_dlq(worker_factory, client):
    from relier_django import TaskFailed
    from relier_django.core.dlq.store import DeadLetterStore

    worker_factory()
    sent = app.send_task("demo.sync_record", args=[], kwargs={"colour": "red"})
    with pytest.raises(TaskFailed):
        relier_django.result(sent.id).get(timeout=60)
    entry = DeadLetterStore(client, KEYS).get(sent.id)
    assert entry is not None and entry.reason == "schema_migration"  # the arguments do not fit
    assert "do not fit demo.sync_record(label" in entry.data["exc_message"]


def test_a_message_adopted_at_receipt_and_never_started_survives_a_sigkill(worker_factory, client):
    # One pool process, busy: the second message waits in the main process, adopted
    # at receipt (before Celery acks it to a pool process), held by the main process.
    first = worker_factory(name="first", concurrency=1)
    busy = app.send_task("demo.sync_record", args=["busy"], kwargs={"sleep_s": 4.0})
    waiting = app.send_task("demo.sync_record", args=["waiting"])
    wait_until(lambda: client.hget(KEYS.task(busy.id), "state") == "running", 30,
               what="the first task to run")  # fmt: skip
    holder = wait_until(lambda: client.hget(KEYS.task(waiting.id), "worker"), 30,
                        what="the waiting message to be adopted")  # fmt: skip
    assert holder == f"{first.hostname}:{first.pid}"  # the main process holds it
    assert client.hget(KEYS.task(waiting.id), "state") == "queued"  # not started
    first.kill()
    worker_factory(name="second")
    for sent, label in ((busy, "busy"), (waiting, "waiting")):
        assert relier_django.result(sent.id).get(timeout=90)["runs"] == 1
        assert len(executions(client, label)) == 1
    assert client.zcard(KEYS.dlq) == 0
