"""A MemoryError escaping a task (a process under ``RLIMIT_AS``) is an OOM death, not
an ordinary failure: the runner hands the incarnation off with cause ``oom``, and the
task's ``max_resurrections`` for ``oom`` decides between a resurrection and the DLQ,
as for a kernel OOM kill (issue 40). A task whose ``retry_on`` names MemoryError is
retried as it asked. Real Redis, the real runner and scanner."""

from __future__ import annotations

import json

from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.model.resurrections import ResurrectionPolicy
from relier_django.core.model.spec import TaskSpec
from relier_django.core.push import producer
from relier_django.core.recovery.resurrector import Resurrector
from relier_django.core.store import event_loop
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker.ending import Ending
from relier_django.core.worker.runner import Runner
from testproject.celery import app

KEYS = KeySpace("rl")


def _exhausts(label: str) -> None:
    raise MemoryError


async def _aexhausts(label: str) -> None:
    raise MemoryError("cannot allocate")


QUARANTINED = TaskSpec(
    name="t.oom_quarantined", fn=_aexhausts, queue="oom",
    max_resurrections=ResurrectionPolicy.parse({"oom": 0, "default": 3}),
)  # fmt: skip
PLAIN = TaskSpec(name="t.oom_plain", fn=_exhausts, queue="oom")
RETRIED = TaskSpec(name="t.oom_retried", fn=_exhausts, queue="oom", retry_on=(MemoryError,))


def _pushed(spec: TaskSpec, label: str) -> Envelope:
    receipt = producer.push(spec, app, (label,), {}, on_commit=False)
    return decode(sync_client(config.current()).hget(KEYS.task(receipt.task_id), "env"))


def _history(client, task_id: str) -> list[tuple[str, int, str]]:  # type: ignore[no-untyped-def]
    events = [json.loads(e) for e in client.lrange(KEYS.history(task_id), 0, -1)]
    return [(e["event"], e["fence"], e.get("cause", "")) for e in events if "cause" in e]


def test_a_memory_error_under_an_oom_0_policy_is_dead_lettered_at_once(redis_client):
    client = sync_client(config.current())
    env = _pushed(QUARANTINED, "async-oom")
    runner = Runner(QUARANTINED, app, config.current(), "test:1")
    ended = event_loop.run(runner.run(env.encode()))
    assert ended.how is Ending.HANDED_OFF
    assert ended.detail == "handed off (oom): MemoryError: cannot allocate"
    assert client.hget(KEYS.task(env.id), "state") == "handoff"

    assert Resurrector(app, config.current(), "s").run_pass().outcomes == {"dead_lettered": 1}
    entry = DeadLetterStore(client, KEYS).get(env.id)
    assert entry is not None
    assert (entry.data["reason"], entry.data["cause"]) == ("resurrection_limit", "oom")


def test_a_memory_error_under_a_plain_limit_is_resurrected_as_an_oom_death(redis_client):
    client = sync_client(config.current())
    env = _pushed(PLAIN, "def-oom")
    ended = Runner(PLAIN, app, config.current(), "test:1").run_blocking(env.encode())
    assert ended.how is Ending.HANDED_OFF

    assert Resurrector(app, config.current(), "s").run_pass().outcomes == {"resurrected": 1}
    assert _history(client, env.id) == [("expired", 1, "oom")]
    assert client.hget(KEYS.task(env.id), "fence") == "2"


def test_a_memory_error_the_task_retries_on_is_retried(redis_client):
    env = _pushed(RETRIED, "retried-oom")
    ended = Runner(RETRIED, app, config.current(), "test:1").run_blocking(env.encode())
    assert ended.how is Ending.RETRIED
    assert ended.detail is not None and "MemoryError" in ended.detail
