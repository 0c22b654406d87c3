"""Rolling deploys: task schema versions and migrations, on real Redis and real workers.

Two workers run side by side with different versions of ``demo.versioned`` (chosen by
DEMO_VERSIONED_SCHEMA), each on its own queue, so the test decides who consumes what.
The in-process tests drive the runner directly against the private Redis for the
failure cases that need no worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import uuid

import pytest
from django.core.management import call_command

from relier_django import TaskContext, TaskFailed
from relier_django.core.dlq.store import DeadLetterStore
from relier_django.core.model import config
from relier_django.core.model.envelope import Envelope, decode
from relier_django.core.model.schema import Schema
from relier_django.core.model.spec import TaskSpec
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker.runner import Runner
from testproject.celery import app
from testproject.demo import tasks

KEYS = KeySpace("rl")
NEW, OLD = "schema.new", "schema.old"  # one queue per worker


def runs(client, label: str) -> int:
    return int(client.llen(f"demo:exec:{label}"))


def entry(task_id: str):
    return DeadLetterStore(sync_client(config.current()), KEYS).get(task_id)


def versioned_v2(ctx: TaskContext, label: str, amount: str, currency: str) -> dict: ...


# What the test process pushes: the v1 task it imported, or the v2 code a new producer has.
assert "DEMO_VERSIONED_SCHEMA" not in os.environ, "the test process must hold the v1 task"
V1 = tasks.versioned.relier_spec
V2 = TaskSpec(name="demo.versioned", fn=versioned_v2, schema=Schema(2, {1: tasks.cents_to_amount}))


def on(spec: TaskSpec, queue: str) -> TaskSpec:
    return dataclasses.replace(spec, queue=queue)


def start_worker(worker_factory, name: str, queue: str, schema: int):
    env = {"DEMO_VERSIONED_SCHEMA": str(schema)}
    return worker_factory(name=name, queues=(queue,), extra_env=env)


def test_old_and_new_workers_side_by_side_during_a_rolling_deploy(worker_factory, redis_client):
    start_worker(worker_factory, "new", NEW, schema=2)
    old = start_worker(worker_factory, "old", OLD, schema=1)

    # An old producer's push reaches a new worker: migrated in memory, then run.
    migrated = producer.push(on(V1, NEW), app, ("from-v1", 1250), {})
    assert migrated.get(timeout=30) == {
        "schema": 2, "label": "from-v1", "amount": "12.50", "currency": "EUR",
    }  # fmt: skip
    # Keyword pushes migrate the same way (the migration binds by name).
    by_name = producer.push(on(V1, NEW), app, (), {"label": "kw-v1", "cents": 5})
    assert by_name.get(timeout=30)["amount"] == "0.05"

    # A new producer's push reaches an old worker: the DLQ, never the v1 function.
    future = producer.push(on(V2, OLD), app, ("from-v2", "3.00", "USD"), {})
    with pytest.raises(TaskFailed) as failed:
        future.get(timeout=30)
    assert failed.value.reason == "schema_migration"
    assert "envelope schema v2 > this worker's v1 of demo.versioned" in failed.value.error
    assert "Deploy the new code to every worker, then release it" in failed.value.error
    dead = entry(future.task_id)
    assert (dead.data["envelope_schema"], dead.data["worker_schema"]) == (2, 1)
    assert dead.envelope["schema_version"] == 2  # kept as pushed, releasable
    assert runs(redis_client, "from-v2") == 0

    # The deploy finishes: the old worker is replaced by one with the new code, and
    # the documented command releases what the old one refused. It runs once.
    old.stop()
    start_worker(worker_factory, "upgraded", OLD, schema=2)
    call_command("relier_dlq", "release", "--all", "--reason", "schema_migration")
    assert future.get(timeout=30) == {
        "schema": 2, "label": "from-v2", "amount": "3.00", "currency": "USD",
    }  # fmt: skip
    assert runs(redis_client, "from-v2") == 1


def test_a_migrated_run_that_fails_keeps_the_envelope_as_pushed(worker_factory, redis_client):
    start_worker(worker_factory, "new", NEW, schema=2)
    receipt = producer.push(on(V1, NEW), app, ("fail-1", 700), {})
    with pytest.raises(TaskFailed) as failed:
        receipt.get(timeout=30)
    assert failed.value.reason == "exception"
    assert "refused 7.00 EUR" in failed.value.error  # the task saw the migrated call
    stored = entry(receipt.task_id).envelope
    # The stored copy was never rewritten: a release can still go to a v1 worker.
    assert (stored["schema_version"], stored["args"]) == (1, ["fail-1", 700])


# --- the runner against the private Redis, no worker ---------------------------------------


def run_in_process(spec: TaskSpec, args: tuple, schema_version: int) -> Envelope:
    """Store an envelope as push does, then run it as a worker would, in this process."""
    client = sync_client(config.current())
    env = Envelope(
        id=uuid.uuid4().hex, task=spec.name, args=args, queue=spec.queue or "",
        schema_version=schema_version,
    )  # fmt: skip
    assert idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client).stored
    runner = Runner(spec, app, config.current(), "test:1")
    asyncio.run(runner.run(env.encode()))
    return env


def recorder(calls: list):
    def task(label: str, amount: str, currency: str) -> str:
        calls.append((label, amount, currency))
        return label

    return task


def test_a_migration_that_raises_dead_letters_with_its_traceback(redis_client):
    def broken(args, kwargs):
        raise KeyError("cents")

    calls: list = []
    spec = TaskSpec(name="t.broken", fn=recorder(calls), schema=Schema(2, {1: broken}))
    env = run_in_process(spec, ("x", "1", "EUR"), schema_version=1)
    dead = entry(env.id)
    assert dead.reason == "schema_migration"
    assert "migration v1→v2 of t.broken raised KeyError" in dead.data["exc_message"]
    assert 'raise KeyError("cents")' in dead.data["traceback"]
    assert calls == []
    assert not redis_client.exists(KEYS.task(env.id))  # moved whole into the DLQ


def test_a_migration_whose_result_does_not_fit_never_reaches_the_task(redis_client):
    calls: list = []
    spec = TaskSpec(
        name="t.unfit", fn=recorder(calls), schema=Schema(2, {1: lambda a, k: (a[:1], k)})
    )
    env = run_in_process(spec, ("x", "1", "EUR"), schema_version=1)
    dead = entry(env.id)
    assert dead.reason == "schema_migration"
    message = dead.data["exc_message"]
    assert "after migrating v1→v2 do not fit t.unfit(label, amount, currency)" in message
    assert "missing a required argument: 'amount'" in message
    assert calls == []


def test_a_retired_version_is_dead_lettered_with_the_way_out(redis_client):
    calls: list = []
    spec = TaskSpec(
        name="t.retired", fn=recorder(calls), schema=Schema(3, {2: lambda a, k: (a, k)})
    )
    env = run_in_process(spec, ("x", "1", "EUR"), schema_version=1)
    message = entry(env.id).data["exc_message"]
    assert "v1 of t.retired has no migration path to v3 (migrations start at v2)" in message
    assert calls == []


def test_a_retry_stores_the_envelope_at_the_version_it_was_pushed(redis_client):
    def flaky(label: str, amount: str, currency: str) -> None:
        raise TimeoutError("later")

    spec = TaskSpec(
        name="t.retry_v1", fn=flaky, retry_on=(TimeoutError,), retry_backoff_s=30,
        queue="schema.nobody", schema=Schema(2, {1: tasks.cents_to_amount}),
    )  # fmt: skip
    env = run_in_process(spec, ("r1", 300), schema_version=1)
    stored = decode(redis_client.hget(KEYS.task(env.id), "env"))
    assert (stored.fence, stored.attempt) == (2, 2)
    assert (stored.schema_version, stored.args) == (1, ("r1", 300))


def test_the_signature_changed_without_a_version_bump_is_caught(redis_client):
    calls: list = []
    spec = TaskSpec(name="t.no_bump", fn=recorder(calls))
    env = run_in_process(spec, ("x", 100), schema_version=1)
    dead = entry(env.id)
    assert dead.reason == "schema_migration"
    assert "bump @rl_task(version=) and add a migration" in dead.data["exc_message"]
    assert json.loads(redis_client.get(KEYS.result(env.id)))["reason"] == "schema_migration"
