"""G5: a task that Celery's hard time limit stopped (``TimeLimitExceeded`` through
``task_failure`` in the worker's main process) is dead-lettered at once, reason
``hard_timeout``, fenced to the incarnation stopped: once, though Celery reports the
stop twice, and never a task that moved on. One stopped before ``start.lua`` is
handed off instead (it never ran)."""

from __future__ import annotations

from billiard.exceptions import TimeLimitExceeded

from relier_django.core.model import config
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from relier_django.core.worker.hooks import _on_task_failure
from testproject.demo import tasks

KEYS = KeySpace("rl")
STOPPED = TimeLimitExceeded(1.5)


def _stored(client, label: str):  # type: ignore[no-untyped-def]
    env = producer.prepare(tasks.sync_record.relier_spec, (label,), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    return env


def _stopped(env) -> None:  # type: ignore[no-untyped-def]
    _on_task_failure(
        sender=tasks.sync_record, task_id=env.id, exception=STOPPED, args=[env.encode()]
    )


def test_a_running_task_stopped_by_the_hard_limit_is_dead_lettered_once(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "stopped")
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    client.hset(KEYS.task(env.id), "partial", '{"v":1,"state":{"step":3}}')

    _stopped(env)
    _stopped(env)  # Celery reports a hard time limit twice: on_failure, then on_timeout
    entry = client.hgetall(KEYS.dlq_entry(env.id))
    assert entry["reason"] == "hard_timeout" and entry["failures"] == "1"
    assert "hard time limit (1.5 s)" in entry["error"]
    assert entry.get("partial")  # the checkpoint moved with it
    assert not client.exists(KEYS.task(env.id))
    assert client.zscore(KEYS.expiry, env.id) is None  # never resurrected for it


def test_a_task_stopped_before_start_lua_is_handed_off_not_filed(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "never-started")

    _stopped(env)
    assert client.hget(KEYS.task(env.id), "state") == "handoff"
    assert not client.exists(KEYS.dlq_entry(env.id))


def test_a_superseded_or_committed_task_is_left_alone(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "moved-on")
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    client.hset(KEYS.task(env.id), "fence", env.fence + 1)  # as a resurrection leaves it
    _stopped(env)
    assert client.hget(KEYS.task(env.id), "state") == "running"
    assert not client.exists(KEYS.dlq_entry(env.id))

    done = _stored(client, "committed")
    assert fencing.start(KEYS, done, "w:1", 60_000).run(client).started
    assert fencing.commit(KEYS, done, '{"ok": true}', 60_000).run(client).accepted
    _stopped(done)  # the limit fired as the commit landed: the commit stands
    assert not client.exists(KEYS.dlq_entry(done.id))
