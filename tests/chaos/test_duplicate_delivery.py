"""G10: every message is safe to deliver twice, to any worker (issue 18).

Each test delivers the very bytes of one message twice, to two real workers, one of
which lacks the task (a worker still on the previous release: ``DEMO_WORKER_LACKS``
in testproject/demo/tasks.py, so the copy reaches Celery's ``task_unknown``), and
proves one execution and one outcome: a result committed and read through the
receipt, or one DLQ entry; never both, never two runs.

How a copy is delivered: the message is published to a queue no worker consumes,
taken off its Redis list (kombu's transport LPUSHes the JSON its consumers BRPOP), and
the same bytes are LPUSHed to a list only one worker consumes at that moment.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from relier_django import TaskFailed
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.store.receipt import Receipt
from relier_django.core.worker import fencing
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import CeleryWorker, wait_until

KEYS = KeySpace("rl")
LACKS = {"DEMO_WORKER_LACKS": "demo.record,demo.sync_record"}
# How long the first copy runs: far longer than the other worker needs to take the
# second copy and answer it (a few ms once it is up), so the second copy always
# arrives while the first one runs.
RUN_S = 3.0


@pytest.fixture
def client(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """relier's own client (decoded replies) on the flushed private Redis."""
    yield sync_client(config.current())


def start_pair(worker_factory: Callable[..., CeleryWorker]) -> tuple[CeleryWorker, CeleryWorker]:
    """A worker with every demo task, consuming ``knows``, and one without demo.record
    and demo.sync_record, consuming ``lacks``; both consume the recovery queue too."""
    knows = worker_factory(name="knows", queues=("knows",))
    return knows, worker_factory(name="lacks", queues=("lacks",), extra_env=LACKS)


@pytest.fixture
def pair(worker_factory: Callable[..., CeleryWorker]) -> tuple[CeleryWorker, CeleryWorker]:
    return start_pair(worker_factory)


def take(broker: redis.Redis, queue: str = "celery") -> bytes:
    """The one message waiting in ``queue``, taken off it: no worker will see it."""
    raw: bytes = wait_until(lambda: broker.rpop(queue), 10, what=f"a message in {queue}")
    assert broker.llen(queue) == 0
    return raw


def deliver(broker: redis.Redis, queue: str, raw: bytes) -> None:
    broker.lpush(queue, raw)


def envelope_of(raw: bytes) -> Envelope:
    body = json.loads(base64.b64decode(json.loads(raw)["body"]))
    return decode(body[0][0])


def state(client: redis.Redis, task_id: str) -> Any:
    return client.hget(KEYS.task(task_id), "state")


def executions(client: redis.Redis, label: str) -> list[int]:
    return [int(r.split(":")[0]) for r in client.lrange(f"demo:exec:{label}", 0, -1)]


def in_log(worker: CeleryWorker, line: str, timeout_s: float = 15) -> None:
    wait_until(lambda: line in worker.log_text(), timeout_s, what=f"{line!r} in {worker.name}")


def run_while_refused_elsewhere(
    client: redis.Redis,
    broker: redis.Redis,
    pair: tuple[CeleryWorker, CeleryWorker],
    raw: bytes,
    queues: tuple[str, str] = ("knows", "lacks"),
    between: Callable[[], None] = lambda: None,
) -> None:
    """Copy 1 (to ``queues[0]``) starts on the worker that knows the task; copy 2 (to
    ``queues[1]``) reaches the one without it while copy 1 runs: its dead-letter is
    refused. ``between`` runs once copy 1 runs, before copy 2 is sent."""
    env = envelope_of(raw)
    deliver(broker, queues[0], raw)
    wait_until(lambda: state(client, env.id) == "running", 15, what="the first copy to run")
    between()
    deliver(broker, queues[1], raw)
    in_log(pair[1], f"task_id={env.id} ")  # the runner's answer to copy 2, whatever it was
    assert client.zcard(KEYS.dlq) == 0, "copy 2 dead-lettered the task copy 1 runs"
    assert state(client, env.id) == "running"  # copy 1 still runs, untouched
    refused = f"dead-letter refused task_id={env.id} fence={env.fence} current_fence={env.fence}"
    assert f"{refused} state=running held=queued" in pair[1].log_text()


def assert_committed_once(
    client: redis.Redis, receipt: Receipt, label: str, fence: int, workers: tuple[CeleryWorker, ...]
) -> None:
    """One execution, one result committed and read through the receipt, no DLQ entry,
    no commit refused."""
    result = receipt.get(timeout=30)
    assert result["fence"] == fence and result["runs"] == 1
    assert executions(client, label) == [fence]
    assert client.zcard(KEYS.dlq) == 0
    # The runner logs its commit just after commit.lua replied, so the line may follow
    # the result a moment later.
    committed = f"committed task_id={receipt.task_id} fence={fence}"
    wait_until(lambda: any(committed in w.log_text() for w in workers), 15, what=committed)
    logs = "".join(w.log_text() for w in workers)
    assert "stale commit rejected" not in logs


def test_a_copy_of_a_running_def_task_reaching_a_worker_without_it_leaves_it_to_commit(
    client, redis_client, pair
):
    receipt = tasks.sync_record.push("dup-def", RUN_S)
    run_while_refused_elsewhere(client, redis_client, pair, take(redis_client))
    assert_committed_once(client, receipt, "dup-def", 1, pair)


def test_a_copy_of_a_running_async_task_reaching_a_worker_without_it_leaves_it_to_commit(
    client, redis_client, pair
):
    receipt = tasks.record.push("dup-async", RUN_S)
    run_while_refused_elsewhere(client, redis_client, pair, take(redis_client))
    assert_committed_once(client, receipt, "dup-async", 1, pair)


def test_a_resurrected_message_delivered_twice_through_the_recovery_queue_runs_once(
    client, redis_client, worker_factory
):
    cfg = config.current()
    receipt = tasks.sync_record.push("dup-recovered", RUN_S)
    first = envelope_of(take(redis_client))  # the first incarnation's message...
    assert fencing.start(KEYS, first, "dead-worker:1", 1).run(client).started  # ...died running
    scanner = Resurrector(app, cfg, "test-scanner")
    wait_until(lambda: scanner.run_pass().resurrected, 10, what="the resurrection")
    raw = take(redis_client, cfg.recovery_queue)  # before any worker consumes it
    assert envelope_of(raw).fence == 2

    knows, lacks = pair = start_pair(worker_factory)

    # Both consume the recovery queue: each copy is let through to one of them.
    def consume_recovery(worker: CeleryWorker, on: bool) -> None:
        change = app.control.add_consumer if on else app.control.cancel_consumer
        replies = change(cfg.recovery_queue, destination=[worker.hostname], reply=True, timeout=5)
        assert replies and all("ok" in r[worker.hostname] for r in replies), replies

    def swap() -> None:
        consume_recovery(knows, False)
        consume_recovery(lacks, True)

    consume_recovery(lacks, False)
    queues = (cfg.recovery_queue, cfg.recovery_queue)
    run_while_refused_elsewhere(client, redis_client, pair, raw, queues, swap)
    assert_committed_once(client, receipt, "dup-recovered", 2, pair)


def test_a_copy_refused_while_the_task_waits_dead_letters_it_once_and_the_other_never_runs(
    client, redis_client, pair
):
    knows, _ = pair
    receipt = tasks.sync_record.push("dup-waiting")
    raw = take(redis_client)
    deliver(redis_client, "lacks", raw)  # first, while the task is still queued
    with pytest.raises(TaskFailed) as err:
        receipt.get(timeout=30)
    assert err.value.reason == "unknown_task"

    deliver(redis_client, "knows", raw)
    in_log(knows, f"message refused task_id={receipt.task_id} fence=1 reason=gone")
    assert executions(client, "dup-waiting") == []
    store = DeadLetterStore(client, KEYS)
    assert store.size() == 1
    assert store.get(receipt.task_id).reason == "unknown_task"
    with pytest.raises(TaskFailed):  # the one outcome stands
        receipt.get(timeout=1)


def test_a_malformed_message_delivered_to_two_workers_is_filed_once(client, redis_client, pair):
    # It carries a fence (so relier, not Celery alone, takes it on the worker without
    # the task) but is no envelope.
    body = json.dumps({"sha256": "0" * 64, "fence": 1, "note": "not an envelope"})
    app.send_task("demo.sync_record", args=[body], serializer="json")
    raw = take(redis_client)
    store = DeadLetterStore(client, KEYS)

    deliver(redis_client, "knows", raw)
    (entry,) = wait_until(lambda: list(store.iter()), 15, what="the DLQ entry")
    deliver(redis_client, "lacks", raw)
    in_log(pair[1], "dead-lettered task_id=- reason=malformed_message")

    (again,) = list(store.iter())
    assert again.id == entry.id and again.id.startswith("msg-")
    assert again.reason == "malformed_message" and again.raw == body
    assert again.summary.failed_at_ms == entry.summary.failed_at_ms  # the second added nothing
    assert store.counts().total == 1 and store.counts().by_reason == {"malformed_message": 1}
