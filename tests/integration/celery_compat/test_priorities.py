"""Priorities (docs/priorities.md): ``priority=0..9``, a higher number taken first, on
every broker. A backlog of mixed priorities is pushed while no worker runs, then one
worker (concurrency 1, prefetch 1) runs it: its order is the order the worker took
the messages in. Real prefork workers on the private Redis (relier's transport) and
on the private RabbitMQ node (a queue declared with ``x-max-priority``)."""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.transport import redis as kombu_redis

from relier_django import testing
from relier_django.core.broker.redis_channel import LOWEST_EVERY
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.tasks.backend import celery_priority
from relier_django.transport import Transport
from testproject.demo import jobs, tasks
from testproject.harness import process_pointed_at, wait_until
from tests.chaos.test_resurrection import FAST

_TRANSPORTS = {"relier": Transport, "kombu": kombu_redis.Transport}
ONE_AT_A_TIME = {"CELERY_WORKER_PREFETCH_MULTIPLIER": "1"}

# (priority, label) pushed in this order; None is a push without a priority.
BACKLOG = [(0, "p0-a"), (5, "p5-a"), (None, "none-a"), (9, "p9-a"), (3, "p3-a"),
           (9, "p9-b"), (1, "p1-a"), (5, "p5-b"), (7, "p7-a")]  # fmt: skip
# Highest first, push order within a priority; no priority is the lowest, 0.
EXPECTED = ["p9-a", "p9-b", "p7-a", "p5-a", "p5-b", "p3-a", "p1-a", "p0-a", "none-a"]


def _order(line: str, count: int) -> list[str]:
    client = sync_client(config.current())
    key = f"demo:order:{line}"
    wait_until(lambda: client.llen(key) >= count, 60, what=f"{count} runs of {line}")
    return [str(label) for label in client.lrange(key, 0, -1)]


def _push_backlog(line: str) -> None:
    assert len(BACKLOG) < LOWEST_EVERY  # within one fairness turn: strict order
    for priority, label in BACKLOG:
        if priority is None:
            tasks.in_order.push(line, label)
        else:
            tasks.in_order.push_with(priority=priority).push(line, label)


def test_on_redis_a_backlog_runs_highest_priority_first(worker_factory, redis_client):
    _push_backlog("redis")
    worker_factory(concurrency=1, extra_env=ONE_AT_A_TIME)
    assert _order("redis", len(BACKLOG)) == EXPECTED


def test_apply_async_and_the_tasks_default_priority_order_the_backlog(worker_factory, redis_client):
    tasks.in_order.apply_async(("calls", "plain"))
    tasks.in_order.apply_async(("calls", "sig-4"), priority=4)
    tasks.in_order.s("calls", "sig-6").set(priority=6).apply_async()
    tasks.urgent.push("calls", "default-9")  # @rl_task(priority=9)
    tasks.urgent.push_with(priority=2).push("calls", "own-2")  # a push's own wins
    worker_factory(concurrency=1, extra_env=ONE_AT_A_TIME)
    assert _order("calls", 5) == ["default-9", "sig-6", "sig-4", "own-2", "plain"]


def test_the_lowest_priority_waits_at_most_one_fairness_turn(worker_factory, redis_client):
    """The starvation bound: of any LOWEST_EVERY takes in a row, one is of the lowest
    priority waiting, however many higher ones wait (and keep coming)."""
    tasks.in_order.push_with(priority=0).push("fair", "low-a")
    tasks.in_order.push_with(priority=4).push("fair", "mid")
    tasks.in_order.push_with(priority=0).push("fair", "low-b")
    urgent = 2 * LOWEST_EVERY + 5
    for i in range(urgent):
        tasks.in_order.push_with(priority=9).push("fair", f"high-{i}")
    worker_factory(concurrency=1, extra_env=ONE_AT_A_TIME)
    order = _order("fair", urgent + 3)
    # Every LOWEST_EVERY-th take is the lowest waiting: low-a, then low-b; then the
    # middle one is the lowest left, and waits no longer than the next turn.
    assert order.index("low-a") == LOWEST_EVERY - 1
    assert order.index("low-b") == 2 * LOWEST_EVERY - 1
    assert order.index("mid") <= 3 * LOWEST_EVERY - 1
    assert [label for label in order if label.startswith("high-")] == [
        f"high-{i}" for i in range(urgent)
    ]


def test_on_rabbitmq_a_backlog_runs_highest_priority_first(
    rabbit_server, worker_factory, redis_client
):
    """The same backlog, the same order, on a RabbitMQ queue declared with
    x-max-priority (Celery's task_queue_max_priority)."""
    env = {
        **FAST,
        **ONE_AT_A_TIME,
        "CELERY_BROKER_URL": rabbit_server.url,
        "CELERY_TASK_DEFAULT_QUEUE": "prio-tasks",
        "CELERY_TASK_QUEUE_MAX_PRIORITY": "9",
        # Queues of its own: the session's node has the others declared without it.
        "RELIER_RECOVERY_QUEUE": "prio-recovery",
    }
    celery = {"task_default_queue": "prio-tasks", "task_queue_max_priority": 9}
    with process_pointed_at(env, **celery):
        _push_backlog("rabbit")
        worker_factory(concurrency=1, extra_env=env)
        assert _order("rabbit", len(BACKLOG)) == EXPECTED
    listed = rabbit_server.ctl("list_queues", "name", "arguments")
    line = next(line for line in listed.splitlines() if line.startswith("prio-tasks"))
    assert "x-max-priority" in line, listed


def test_eager_mode_ignores_priority(redis_client):
    """Eager mode runs each push inline, in call order: there is no queue to reorder."""
    with testing.eager():
        tasks.in_order.push_with(priority=0).push("eager", "first")
        tasks.in_order.apply_async(("eager", "second"), priority=9)
    assert _order("eager", 2) == ["first", "second"]


@pytest.mark.parametrize("bad", [10, -1])
def test_a_priority_outside_0_to_9_is_refused_at_the_call(bad, redis_client):
    with pytest.raises(ValueError, match="0 to 9"):
        tasks.in_order.push_with(priority=bad)
    with pytest.raises(ValueError, match="0 to 9"):
        tasks.in_order.apply_async(("refused", "x"), priority=bad)
    with pytest.raises(TypeError, match="an int"):
        tasks.in_order.push_with(priority="9")
    assert redis_client.dbsize() == 0  # nothing stored


def test_django_tasks_priorities_map_onto_0_to_9_in_order():
    mapped = [celery_priority(p) for p in range(-100, 101)]
    assert mapped == sorted(mapped)  # a higher django.tasks priority is never below
    assert (mapped[0], celery_priority(0), mapped[-1]) == (0, 4, 9)
    assert sorted(set(mapped)) == list(range(10))


def test_django_tasks_run_a_backlog_highest_priority_first(worker_factory, redis_client):
    for priority, label in [(-100, "lowest"), (0, "default"), (100, "highest"), (50, "high")]:
        jobs.in_order.using(priority=priority).enqueue("django", label)
    worker_factory(concurrency=1, extra_env=ONE_AT_A_TIME)
    assert _order("django", 4) == ["highest", "high", "default", "lowest"]


def _kombu_publish(url: str, transport: Any, queue: Queue, bodies: list[tuple[int | None, str]]):
    with Connection(url, transport=transport) as conn:
        producer = Producer(conn.default_channel)
        for priority, body in bodies:
            producer.publish(
                body, exchange=queue.exchange, routing_key=queue.routing_key,
                declare=[queue], priority=priority,
            )  # fmt: skip


def _drain(url: str, queue: Queue, count: int) -> list[str]:
    """What a kombu consumer on relier's transport, with no taker (kombu's BRPOP; a
    worker takes with take.lua instead), receives, one at a time."""
    got: list[str] = []
    with Connection(url, transport=Transport) as conn:

        def on_message(body: str, message: Any) -> None:
            got.append(body)
            message.ack()

        consumer = Consumer(conn.channel(), [queue], callbacks=[on_message])
        consumer.qos(prefetch_count=1)
        consumer.consume()
        while len(got) < count:
            conn.drain_events(timeout=5)
    return got


@pytest.mark.parametrize("producer", ["relier", "kombu"])
def test_a_plain_consumer_on_relier_transport_takes_the_highest_first_and_keeps_the_bound(
    producer, redis_server, redis_client
):
    """Whoever queued them (kombu's own transport files priority 7 under its level 6),
    relier's transport asks every level, highest first; its BRPOP keeps the fairness
    turn too."""
    queue = Queue("pq", Exchange("pq", type="direct"), routing_key="pq")
    backlog: list[tuple[int | None, str]] = [
        (0, "p0"), (5, "p5"), (None, "none"), (9, "p9"), (3, "p3"), (7, "p7"),
    ]  # fmt: skip
    _kombu_publish(redis_server.url, _TRANSPORTS[producer], queue, backlog)
    assert _drain(redis_server.url, queue, 6) == ["p9", "p7", "p5", "p3", "p0", "none"]
    urgent = [(9, f"high-{i}") for i in range(LOWEST_EVERY + 2)]
    _kombu_publish(redis_server.url, _TRANSPORTS[producer], queue, [(1, "low"), *urgent])
    order = _drain(redis_server.url, queue, len(urgent) + 1)
    assert order.index("low") <= LOWEST_EVERY - 1


def test_basic_get_takes_the_highest_priority_first(redis_server, redis_client):
    queue = Queue("gq", Exchange("gq", type="direct"), routing_key="gq")
    _kombu_publish(redis_server.url, Transport, queue, [(2, "p2"), (8, "p8"), (None, "none")])
    with Connection(redis_server.url, transport=Transport) as conn:
        channel = conn.channel()
        got = [channel.basic_get("gq", no_ack=True).body for _ in range(3)]
    assert [body.decode() if isinstance(body, bytes) else body for body in got] == [
        "p8", "p2", "none"
    ]  # fmt: skip


def test_a_chains_later_step_is_queued_with_its_signatures_priority(worker_factory, redis_client):
    """The step a commit creates carries its signature's priority (else its task's): it
    is taken before the backlog of lower priority that waited before it existed."""
    head = tasks.in_order.si("chain", "head").set(priority=9)
    (head | tasks.in_order.si("chain", "step").set(priority=9)).apply_async()
    for label in ("low-a", "low-b", "low-c"):
        tasks.in_order.push("chain", label)
    worker_factory(concurrency=1, extra_env=ONE_AT_A_TIME)
    order = _order("chain", 5)
    # One message may be taken while the head runs, before its commit creates the step.
    assert order[0] == "head" and order.index("step") <= 2 and order[-1] == "low-c", order


def test_the_running_task_reads_its_priority_from_self_request(worker, redis_client):
    assert tasks.own_priority.push().get(timeout=30) == 3  # the task's default
    assert tasks.own_priority.apply_async(priority=8).get(timeout=30) == 8
