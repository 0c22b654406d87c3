"""A pool process that dies under a task (``WorkerLostError`` in the worker's main
process) hands that task off at once: ``handoff.lua``, in whichever state the dead
process held it, and never a task that moved on."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from billiard.exceptions import WorkerLostError

from relier_django import metrics, signals
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.push import idempotency, producer
from relier_django.core.recovery import deaths
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from relier_django.core.worker.hooks import _on_task_failure
from testproject.celery import app
from testproject.demo import tasks

KEYS = KeySpace("rl")
LOST = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 0.")


def _stored(client, label: str, max_resurrections: int = 3):  # type: ignore[no-untyped-def]
    env = producer.prepare(tasks.record.relier_spec, (label,), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, max_resurrections).run(client)
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


SEGV = WorkerLostError("Worker exited prematurely: signal 11 (SIGSEGV) Job: 0.")
EXIT3 = WorkerLostError("Worker exited prematurely: exitcode 3 Job: 0.")


def _causes(client, task_id: str) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    events = [json.loads(e) for e in client.lrange(KEYS.history(task_id), 0, -1)]
    return [(e["fence"], e["cause"]) for e in events if e["event"] == "expired"]


def _resurrected() -> tuple[list[dict[str, Any]], Any]:
    sent: list[dict[str, Any]] = []

    def receive(**kwargs: Any) -> None:
        sent.append(kwargs)

    signals.task_resurrected.connect(receive, weak=False)
    return sent, receive


def test_how_the_pool_process_died_is_in_the_history_and_task_resurrected(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "segfault")
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    _lost(env, exception=SEGV)
    sent, receive = _resurrected()
    try:
        assert Resurrector(app, config.current(), "s").run_pass().outcomes == {"resurrected": 1}
    finally:
        signals.task_resurrected.disconnect(receive)
    assert _causes(client, env.id) == [(1, "signal:SIGSEGV")]
    assert [(k["task_id"], k["cause"]) for k in sent] == [(env.id, "signal:SIGSEGV")]
    assert metrics.read().deaths == {"signal:SIGSEGV": 1}


def test_the_scanner_finding_the_closed_connection_first_keeps_the_exit_status(redis_client):
    # The same death seen twice: the pool process's liveness connection closed
    # (orphans.lua), then its main process's report, before a pass resurrects it.
    client = sync_client(config.current())
    env = _stored(client, "exit-3")
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    assert deaths.hand_off(KEYS, [(env.id, "w:1", 1_000)]).run(client) == 1
    _lost(env, exception=EXIT3)
    assert Resurrector(app, config.current(), "s").run_pass().outcomes == {"resurrected": 1}
    assert _causes(client, env.id) == [(1, "exit:3")]


def test_a_closed_connection_alone_reads_connection_closed_and_a_stale_cause_is_not_reused(
    redis_client,
):
    client = sync_client(config.current())
    env = _stored(client, "twice")
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    _lost(env, exception=EXIT3)
    assert Resurrector(app, config.current(), "s").run_pass().outcomes == {"resurrected": 1}
    nxt = dataclasses.replace(env, fence=2, resurrections=1)
    assert fencing.start(KEYS, nxt, "w:2", 60_000).run(client).started
    assert deaths.hand_off(KEYS, [(env.id, "w:2", 1_000)]).run(client) == 1
    assert Resurrector(app, config.current(), "s").run_pass().outcomes == {"resurrected": 1}
    assert _causes(client, env.id) == [(1, "exit:3"), (2, "connection_closed")]


def test_the_resurrection_limit_dlq_entry_names_the_last_death(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "loop", max_resurrections=1)
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    _lost(env, exception=SEGV)
    assert Resurrector(app, config.current(), "s").run_pass().outcomes == {"resurrected": 1}
    nxt = dataclasses.replace(env, fence=2, resurrections=1)
    assert fencing.start(KEYS, nxt, "w:2", 60_000).run(client).started
    _lost(nxt, exception=EXIT3)
    outcomes = Resurrector(app, config.current(), "s").run_pass().outcomes
    assert outcomes == {"dead_lettered": 1}
    entry = DeadLetterStore(client, KEYS).get(env.id)
    assert entry is not None
    assert entry.data["reason"] == "resurrection_limit"
    assert entry.data["cause"] == "exit:3"
    assert [(h["fence"], h["cause"]) for h in entry.history if h["event"] == "expired"] == [
        (1, "signal:SIGSEGV"),
        (2, "exit:3"),
    ]


def test_a_report_after_the_resurrection_is_added_to_the_history_once(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "late")
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    assert deaths.hand_off(KEYS, [(env.id, "w:1", 1_000)]).run(client) == 1
    assert Resurrector(app, config.current(), "s").run_pass().outcomes == {"resurrected": 1}
    _lost(env, exception=SEGV)
    _lost(env, exception=SEGV)  # a second report of the same death adds nothing
    events = [json.loads(e) for e in client.lrange(KEYS.history(env.id), 0, -1)]
    assert [(e["event"], e["fence"], e.get("cause")) for e in events if "cause" in e] == [
        ("expired", 1, "connection_closed"),
        ("died", 1, "signal:SIGSEGV"),
    ]
    assert client.hget(KEYS.task(env.id), "fence") == "2"  # the new incarnation untouched
