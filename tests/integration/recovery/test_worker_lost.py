"""A pool process that dies under a task (``WorkerLostError`` in the worker's main
process) hands that task off at once: ``handoff.lua``, in whichever state the dead
process held it, and never a task that moved on."""

from __future__ import annotations

from billiard.exceptions import WorkerLostError

from relier_django.core.model import config
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from relier_django.core.worker.hooks import _on_task_failure
from testproject.demo import tasks

KEYS = KeySpace("rl")
LOST = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 0.")


def _stored(client, label: str):  # type: ignore[no-untyped-def]
    env = producer.prepare(tasks.record.relier_spec, (label,), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    return env


def _lost(env, exception=LOST) -> None:  # type: ignore[no-untyped-def]
    _on_task_failure(task_id=env.id, exception=exception, args=[env.encode()])


def _now_ms(client) -> int:  # type: ignore[no-untyped-def]
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_a_task_whose_process_died_running_it_expires_now(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "died-running")
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    assert client.zscore(KEYS.expiry, env.id) > _now_ms(client) + 50_000

    _lost(env)
    assert client.hget(KEYS.task(env.id), "state") == "handoff"
    assert client.zscore(KEYS.expiry, env.id) <= _now_ms(client)  # the next scan takes it


def test_a_task_whose_process_died_before_start_lua_expires_now(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "died-accepting")  # accepted by Celery, never started

    _lost(env)
    assert client.hget(KEYS.task(env.id), "state") == "handoff"
    assert client.zscore(KEYS.expiry, env.id) <= _now_ms(client)


def test_a_superseded_or_finished_task_is_left_alone(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "moved-on")
    newer = env.next_incarnation(attempt=env.attempt)  # a fence the dead process never held
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    client.hset(KEYS.task(env.id), "fence", newer.fence)  # as a resurrection leaves it
    _lost(env)
    assert client.hget(KEYS.task(env.id), "state") == "running"

    done = _stored(client, "committed")
    assert fencing.start(KEYS, done, "w:1", 60_000).run(client).started
    assert fencing.commit(KEYS, done, '{"ok": true}', 60_000).run(client).accepted
    _lost(done)  # the process died after its commit: nothing to bring back
    assert not client.exists(KEYS.task(done.id))
    assert client.zscore(KEYS.expiry, done.id) is None


def test_other_failures_and_other_tasks_are_not_handed_off(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "still-running")
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    _lost(env, exception=RuntimeError("a task's own error"))
    _on_task_failure(task_id=env.id, exception=LOST, args=["not", "an envelope"])
    assert client.hget(KEYS.task(env.id), "state") == "running"
