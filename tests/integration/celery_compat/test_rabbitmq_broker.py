"""RabbitMQ as Celery's broker, relier's store on Redis (docs/operations.md, "RabbitMQ
as the broker"): real prefork workers on a private RabbitMQ node
(testproject/rabbitmq.py), real SIGKILLs, a real node restart."""

from __future__ import annotations

import relier_django
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from testproject.demo import tasks
from testproject.harness import process_pointed_at, wait_until
from tests.chaos.test_resurrection import FAST, executions, running_pid
from tests.leaks import assert_no_leaked_keys


def _store():  # type: ignore[no-untyped-def]
    return sync_client(config.current())  # decoded replies, as executions() reads them


def _on(rabbit_server) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {**FAST, "CELERY_BROKER_URL": rabbit_server.url}


def test_a_push_through_rabbitmq_runs_once(rabbit_server, worker_factory, redis_client):
    env = _on(rabbit_server)
    with process_pointed_at(env):
        worker_factory(extra_env=env)
        receipt = tasks.record.push("through-rabbit", 0)
        assert receipt.get(timeout=60)["label"] == "through-rabbit"
        assert executions(_store(), "through-rabbit") == [1]


def test_a_worker_killed_with_tasks_running_and_prefetched_loses_none(
    rabbit_server, worker_factory, redis_client
):
    """RabbitMQ requeues the dead consumer's unacked (prefetched) messages at once, and
    relier resurrects the running one (acked on receipt, as Celery does by default):
    every task commits once, each run at a higher fence than the one before."""
    env = _on(rabbit_server)
    with process_pointed_at(env):
        doomed = worker_factory(name="doomed", concurrency=1, extra_env=env)
        client = sync_client(config.current())
        labels = [f"rabbit-kill-{i}" for i in range(4)]
        receipts = [tasks.record.push(label, 1.5) for label in labels]
        running_pid(client, receipts[0].task_id)
        wait_until(lambda: doomed.log_text().count("received") >= 4, 15, what="the prefetch")
        doomed.kill()  # one running, three prefetched
        worker_factory(name="successor", concurrency=2, extra_env=env)

        results = [r.get(timeout=60) for r in receipts]
        assert [r["label"] for r in results] == labels
        for label, result in zip(labels, results, strict=True):
            runs = executions(_store(), label)
            assert runs == sorted(set(runs)) and runs[-1] == result["fence"], (label, runs)
        assert executions(_store(), labels[0]) == [2]  # killed mid-run, it ran again at fence 2
    assert_no_leaked_keys(redis_client)


def test_a_rabbitmq_node_restart_mid_run_loses_nothing(rabbit_server, worker_factory, redis_client):
    env = _on(rabbit_server)
    with process_pointed_at(env):
        worker_factory(extra_env=env)
        labels = [f"rabbit-restart-{i}" for i in range(10)]
        receipts = [tasks.record.push(label, 0.5) for label in labels]
        wait_until(lambda: executions(_store(), labels[0]), 30, what="the first task")
        rabbit_server.restart()  # queued and prefetched messages go down with the node

        assert [r.get(timeout=90)["label"] for r in receipts] == labels
        for label in labels:
            runs = executions(_store(), label)
            assert runs and runs == sorted(set(runs)), (label, runs)
    assert_no_leaked_keys(redis_client)


def test_with_quorum_queues_the_recovery_queue_is_a_quorum_queue_too(
    rabbit_server, worker_factory, redis_client
):
    """A resurrected task is published to the recovery queue, declared of the type of
    the project's queues (publish.declare): quorum here, as the default queue."""
    env = {
        **_on(rabbit_server),
        "CELERY_TASK_DEFAULT_QUEUE_TYPE": "quorum",
        "CELERY_TASK_DEFAULT_QUEUE": "quorum-tasks",
        "RELIER_RECOVERY_QUEUE": "quorum-recovery",
    }
    celery = {"task_default_queue_type": "quorum", "task_default_queue": "quorum-tasks"}
    with process_pointed_at(env, **celery):
        worker = worker_factory(extra_env=env)
        receipt = tasks.record.push("quorum-resurrected", 1.5)
        worker.kill_child(running_pid(sync_client(config.current()), receipt.task_id))
        assert receipt.get(timeout=60)["fence"] == 2  # resurrected, through quorum-recovery
    listed = rabbit_server.ctl("list_queues", "name", "type")
    types = dict(line.split()[:2] for line in listed.splitlines() if "quorum-" in line)
    assert types == {"quorum-tasks": "quorum", "quorum-recovery": "quorum"}, listed


def test_a_message_a_quorum_queue_drops_at_its_delivery_limit_comes_back_from_the_store(
    rabbit_server, worker_factory, redis_client, settings
):
    """RabbitMQ drops a quorum queue's message returned more times than its delivery
    limit, without a word (relier.W009). relier's stored copy brings the task back after
    the queued grace (short here), through the recovery queue, at fence 2."""
    from kombu import Connection, Queue

    limited = Queue("limited", queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": 0})
    settings.RELIER = {**settings.RELIER, "QUEUED_GRACE_S": 3.0}  # the push dates the task
    env = {**_on(rabbit_server), "RELIER_QUEUED_GRACE_S": "3"}
    with process_pointed_at(env, task_queues=[limited, Queue("celery")]):
        receipt = tasks.record.apply_async(("dropped", 0), queue="limited")
        # A consumer takes the message and dies without acking it: returned once, over
        # the limit of 0, so RabbitMQ drops it.
        with Connection(rabbit_server.url) as conn:
            assert conn.default_channel.basic_get("limited", no_ack=False) is not None
        listed = rabbit_server.ctl("list_queues", "name", "messages", "--quiet")
        assert "limited\t0" in listed, listed
        worker_factory(extra_env=env)  # consumes celery and the recovery queue only

        assert relier_django.result(receipt.id).get(timeout=60)["fence"] == 2
        assert executions(_store(), "dropped") == [2]
