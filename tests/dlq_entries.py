"""Fabricated DLQ entries for the store, command and admin tests: written by the real
``dead_letter.lua`` in milliseconds, with no worker in the loop."""

from __future__ import annotations

import dataclasses

from relier_django.core.dlq import dead_letter as dlq
from relier_django.core.model import config
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.model.failure import Failure, Reason
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks


def traceback_of(message: str) -> str:
    return f"Traceback (most recent call last):\n  ...\nValueError: {message}\n"


def fail(
    task=tasks.record,
    *args: object,
    reason: Reason = Reason.EXCEPTION,
    message: str = "boom",
    task_id: str | None = None,
    raw_id: str | None = None,
) -> Envelope:
    """Store a task as push() does (not sent) and dead-letter its first incarnation.
    ``raw_id``: store it under this id unchecked, as a push before ids were checked
    (``model.ids``) could."""
    env = store(task, *args, task_id=task_id, raw_id=raw_id)
    cfg = config.current()
    keys, client = KeySpace.of(cfg), sync_client(cfg)
    failure = Failure(reason, "ValueError", message, traceback_of(message), worker="w1@host:1")
    assert dlq.dead_letter(keys, failure, 60_000, env=env, held="queued").run(client).accepted
    return env


def store(
    task=tasks.record, *args: object, task_id: str | None = None, raw_id: str | None = None
) -> Envelope:
    """Store a task as push() does, queued and not sent; ``raw_id`` as for :func:`fail`."""
    cfg = config.current()
    keys, client = KeySpace.of(cfg), sync_client(cfg)
    env = producer.prepare(task.relier_spec, args or ("x",), {}, task_id)
    if raw_id is not None:
        env = dataclasses.replace(env, id=raw_id)
    assert idempotency.store(keys, env, env.encode(), 60_000, 3).run(client).stored
    return env


def fail_again(task_id: str, message: str = "again") -> Envelope:
    """Dead-letter a released task's new incarnation: the same entry id, a higher fence."""
    cfg = config.current()
    keys, client = KeySpace.of(cfg), sync_client(cfg)
    env = decode(client.hget(keys.task(task_id), "env"))
    failure = Failure(
        Reason.EXCEPTION, "ValueError", message, traceback_of(message), worker="w2@host:2"
    )
    # Released, it is queued again: it fails as a message refused before it started.
    assert dlq.dead_letter(keys, failure, 60_000, env=env, held="queued").run(client).accepted
    return env


def untied(
    raw: str = "<not json>",
    *,
    task: str = "",
    queue: str = "q1",
    reason: Reason = Reason.MALFORMED_MESSAGE,
) -> str:
    """Dead-letter a message that is no envelope (kept raw, not releasable); its entry id."""
    cfg = config.current()
    failure = Failure(reason, "NotAnEnvelope", "not an envelope")
    call = dlq.dead_letter(
        KeySpace.of(cfg), failure, 60_000, env=None, raw=raw, queue=queue, task=task
    )
    assert call.run(sync_client(cfg)).accepted
    return str(call.args[2])  # the entry id dead_letter minted
