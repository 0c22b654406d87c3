"""``max_resurrections`` by cause of death (issue 40): resurrect.lua takes the limit of
the death it is handling, so an OOM loop is quarantined at once while a lost host or a
closed connection is retried. Real Redis, the real scripts and scanner."""

from __future__ import annotations

import dataclasses

from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.push import idempotency, producer
from relier_django.core.recovery import deaths
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from testproject.celery import app
from testproject.demo import tasks

KEYS = KeySpace("rl")


def _stored(client, label: str, policy: str):  # type: ignore[no-untyped-def]
    env = producer.prepare(tasks.record.relier_spec, (label,), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, policy).run(client)
    return env


def _died(client, env, death: str) -> None:  # type: ignore[no-untyped-def]
    """The incarnation at ``env``'s fence starts, then dies of ``death`` as its main
    process (or its runner, for a MemoryError) reports it."""
    assert fencing.start(KEYS, env, f"w:{env.fence}", 60_000).run(client).started
    held = [(env.id, env.fence)]
    assert fencing.handoff(KEYS, held, "running", "pool_death", death=death).run(client) == 1


def _pass() -> dict[str, int]:
    return dict(Resurrector(app, config.current(), "s").run_pass().outcomes)


def test_an_oom_death_is_dead_lettered_at_once_when_its_limit_is_0(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "oom-at-once", "3,oom=0")
    _died(client, env, "oom")

    assert _pass() == {"dead_lettered": 1}
    entry = DeadLetterStore(client, KEYS).get(env.id)
    assert entry is not None
    assert entry.data["reason"] == "resurrection_limit"
    assert entry.data["cause"] == "oom"
    assert entry.data["exc_message"] == (
        "its worker died or stalled 1 times (max_resurrections=0 for its last death: oom)"
    )


def test_a_lost_process_under_the_same_policy_is_resurrected_up_to_the_default(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "lost-retried", "1,oom=0")
    assert fencing.start(KEYS, env, "w:1", 60_000).run(client).started
    assert deaths.hand_off(KEYS, [(env.id, "w:1", 1_000)]).run(client) == 1
    assert _pass() == {"resurrected": 1}  # connection_closed: the default, 1

    nxt = dataclasses.replace(env, fence=2, resurrections=1)
    assert fencing.start(KEYS, nxt, "w:2", 60_000).run(client).started
    assert deaths.hand_off(KEYS, [(env.id, "w:2", 1_000)]).run(client) == 1
    assert _pass() == {"dead_lettered": 1}  # the default reached
    entry = DeadLetterStore(client, KEYS).get(env.id)
    assert entry is not None
    assert entry.data["cause"] == "connection_closed"


def test_a_family_s_limit_covers_each_of_its_signals(redis_client):
    client = sync_client(config.current())
    env = _stored(client, "signals", "5,signal=1")
    _died(client, env, "signal:SIGSEGV")
    assert _pass() == {"resurrected": 1}  # 0 resurrections so far < 1

    _died(client, dataclasses.replace(env, fence=2, resurrections=1), "signal:SIGKILL")
    assert _pass() == {"dead_lettered": 1}  # 1 so far: not < 1
    entry = DeadLetterStore(client, KEYS).get(env.id)
    assert entry is not None
    assert entry.data["cause"] == "signal:SIGKILL"
    assert [(h["fence"], h["cause"]) for h in entry.history if h["event"] == "expired"] == [
        (1, "signal:SIGSEGV"),
        (2, "signal:SIGKILL"),
    ]


def test_a_limit_by_cause_counts_every_resurrection_so_far(redis_client):
    """A cause's limit is a ceiling on the task's resurrections of any cause: an OOM
    after one lost host, under ``oom=1``, is past it."""
    client = sync_client(config.current())
    env = _stored(client, "oom-after-lost", "3,oom=1")
    _died(client, env, "exit:3")
    assert _pass() == {"resurrected": 1}
    _died(client, dataclasses.replace(env, fence=2, resurrections=1), "oom")
    assert _pass() == {"dead_lettered": 1}


def test_a_push_of_a_task_with_a_policy_stores_it_for_the_scanner(redis_client):
    client = sync_client(config.current())
    receipt = tasks.hog.push("hog-stored", 0)
    assert client.hget(KEYS.task(receipt.task_id), "maxres") == "3,oom=0"
    plain = tasks.record.push("plain-stored")
    assert client.hget(KEYS.task(plain.task_id), "maxres") == "3"


def test_the_setting_quarantines_an_oom_death_of_a_task_without_a_policy(redis_client, settings):
    settings.RELIER = {**settings.RELIER, "RESURRECTIONS_BY_CAUSE": {"oom": 0}}
    client = sync_client(config.current())
    receipt = tasks.record.push("setting-oom")
    assert client.hget(KEYS.task(receipt.task_id), "maxres") == "3,oom=0"
    env = producer.prepare(tasks.record.relier_spec, ("setting-oom",), {}, receipt.task_id)
    _died(client, env, "oom")
    assert _pass() == {"dead_lettered": 1}
    entry = DeadLetterStore(client, KEYS).get(receipt.task_id)
    assert entry is not None and entry.data["cause"] == "oom"
