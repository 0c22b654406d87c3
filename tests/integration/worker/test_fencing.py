"""G2: a stale incarnation cannot commit; scripts survive SCRIPT FLUSH."""

from __future__ import annotations

import json

from relier_django.core.broker import publish
from relier_django.core.dlq import dead_letter as dlq
from relier_django.core.model import config, outcome
from relier_django.core.model.envelope import decode
from relier_django.core.model.failure import Failure, Reason
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import fencing
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until

KEYS = KeySpace("rl")


def test_a_stale_incarnation_cannot_commit_and_the_current_result_stands(worker, redis_client):
    client = sync_client(config.current())
    receipt = tasks.sync_record.push("zombie", 1.5)
    task_key = KEYS.task(receipt.task_id)
    wait_until(lambda: client.hget(task_key, "state") == "running", 30, what="first incarnation")

    # What a resurrection does: mint the next fence and re-dispatch the stored envelope.
    old = decode(client.hget(task_key, "env"))
    nxt = old.next_incarnation(resurrections=1)
    client.hset(task_key, mapping={"fence": nxt.fence, "state": "queued", "env": nxt.encode()})
    publish.send(app, nxt)

    result = receipt.get(timeout=30)
    assert result["fence"] == 2
    fences = [r.split(":")[0] for r in client.lrange("demo:exec:zombie", 0, -1)]
    assert sorted(fences) == ["1", "2"]  # both incarnations ran; only one committed
    assert (
        f"stale commit rejected task_id={receipt.task_id} fence=1 current_fence=2"
        in worker.log_text()
    )
    # The committed result is still the current incarnation's.
    assert json.loads(client.get(KEYS.result(receipt.task_id)))["result"]["fence"] == 2


def test_commit_with_an_old_fence_is_refused_by_the_script(redis_client):
    client = sync_client(config.current())
    env = producer.prepare(tasks.record.relier_spec, ("x",), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    assert fencing.start(KEYS, env, "w:1", 10_000).run(client).started
    client.hincrby(KEYS.task(env.id), "fence", 1)  # a newer incarnation exists
    refused = fencing.commit(KEYS, env, '{"status":"ok","result":1}', 60_000).run(client)
    assert not refused.accepted and refused.value == 2
    assert client.get(KEYS.result(env.id)) is None


def test_heartbeat_refresh_reports_a_task_whose_fence_moved(redis_client):
    client = sync_client(config.current())
    envs = [producer.prepare(tasks.record.relier_spec, (f"h{i}",), {}) for i in range(3)]
    for env in envs:
        idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
        fencing.start(KEYS, env, "w:1", 1_000).run(client)
    client.hincrby(KEYS.task(envs[1].id), "fence", 1)
    lost = fencing.heartbeat(KEYS, [(e.id, e.fence) for e in envs], 5_000).run(client)
    assert lost == [envs[1].id]
    deadlines = dict(client.zrange(KEYS.expiry, 0, -1, withscores=True))
    assert deadlines[envs[0].id] > deadlines[envs[1].id]  # only live tasks were extended


def test_script_flush_in_the_middle_of_a_workload(worker, redis_client):
    receipts = [tasks.record.push(f"flush-{i}", 0.05) for i in range(10)]
    redis_client.script_flush()
    receipts += [tasks.record.push(f"flush-{i}", 0.05) for i in range(10, 20)]
    redis_client.script_flush()  # the worker's start/commit calls hit NOSCRIPT too
    results = [r.get(timeout=60) for r in receipts]
    assert [r["label"] for r in results] == [f"flush-{i}" for i in range(20)]


def _superseded_once_running(client, receipt):  # type: ignore[no-untyped-def]
    """Wait until ``receipt``'s task runs, then move its fence on: what a resurrection
    elsewhere does to the running incarnation."""
    task_key = KEYS.task(receipt.task_id)
    wait_until(lambda: client.hget(task_key, "state") == "running", 30, what="the task to start")
    client.hincrby(task_key, "fence", 1)  # a newer incarnation now owns the task
    return receipt


def test_a_running_async_incarnation_is_cancelled_when_its_fence_moves(
    worker_factory, redis_client
):
    worker = worker_factory(extra_env={"RELIER_HEARTBEAT_TTL_S": "1.5"})
    client = sync_client(config.current())
    receipt = _superseded_once_running(client, tasks.record.push("superseded", 6))

    line = f"incarnation cancelled: superseded task_id={receipt.task_id} fence=1"
    wait_until(lambda: line in worker.log_text(), 10, what="zombie self-detection")
    # Cancelled at its await: it never reached the line that records a run.
    assert client.llen("demo:exec:superseded") == 0
    assert client.get(KEYS.result(receipt.task_id)) is None


def test_start_refuses_a_second_delivery_of_the_current_incarnation(redis_client):
    client = sync_client(config.current())
    env = producer.prepare(tasks.record.relier_spec, ("twice",), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    first = fencing.start(KEYS, env, "w:1", 10_000).run(client)
    second = fencing.start(KEYS, env, "w:2", 10_000).run(client)
    assert first.started and not second.started
    assert (second.refusal, second.current_fence) == ("started", 1)
    assert client.hget(KEYS.task(env.id), "worker") == "w:1"


def test_a_replayed_start_is_the_start_it_made_and_another_delivery_is_refused(redis_client):
    """A start whose reply was lost is retried by the client: the same call must be
    answered as the start it made (else the worker abandons its own valid run and the
    task waits a whole TTL), while another delivery, even from the same worker, is not."""
    client = sync_client(config.current())
    env = producer.prepare(tasks.record.relier_spec, ("replayed",), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    call = fencing.start(KEYS, env, "w:1", 10_000)
    first, replay = call.run(client), call.run(client)
    assert first == replay and first.started and first.current_fence == 1
    other = fencing.start(KEYS, env, "w:1", 10_000).run(client)
    assert not other.started and other.refusal == "started"
    starts = [e for e in client.lrange(KEYS.history(env.id), 0, -1) if '"start"' in e]
    assert len(starts) == 1  # the replay recorded nothing new


def test_a_running_def_incarnation_learns_it_was_superseded_and_cannot_commit(
    worker_factory, redis_client
):
    """A plain ``def`` task runs in Celery's pool thread, not on the loop that keeps
    its heartbeat: the refresh that finds its fence moved still reaches it
    (``ctx.is_current()``), and its commit is refused (G2)."""
    worker = worker_factory(extra_env={"RELIER_HEARTBEAT_TTL_S": "1.5"})
    client = sync_client(config.current())
    receipt = _superseded_once_running(client, tasks.watch_fence.push("def-superseded", 20))

    wait_until(lambda: client.llen("demo:watch:def-superseded"), 15, what="self-detection")
    assert client.lrange("demo:watch:def-superseded", 0, -1) == ["superseded:MainThread"]
    line = f"stale commit rejected task_id={receipt.task_id} fence=1 current_fence=2"
    wait_until(lambda: line in worker.log_text(), 10, what="the refused commit")
    assert client.get(KEYS.result(receipt.task_id)) is None


def test_a_copy_refused_before_its_start_cannot_dead_letter_the_running_copy(redis_client):
    """G10: a second copy of the running incarnation reaching a worker that lacks the
    task (a rolling deploy) files it only while it waits for its start. Here it runs:
    the dead-letter is refused, the task, its claim and its commit stand."""
    client = sync_client(config.current())
    env = producer.prepare(tasks.charge.relier_spec, ("o-dup", 1), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    assert fencing.start(KEYS, env, "w:1", 10_000).run(client).started
    failure = Failure(Reason.UNKNOWN_TASK, "NotRegistered", "no task here", worker="w:2")
    refused = dlq.dead_letter(KEYS, failure, 60_000, env=env, held="queued").run(client)
    assert (refused.accepted, refused.value, refused.state) == (False, env.fence, "running")
    assert client.zcard(KEYS.dlq) == 0
    assert client.get(KEYS.idempotency(env.task, env.idem_key)) == env.id
    record = outcome.succeeded(1, env.fence)
    assert fencing.commit(KEYS, env, record, 60_000).run(client).accepted


def test_a_copy_refused_while_the_task_waits_is_dead_lettered_once(redis_client):
    """Not started anywhere: the refused copy files it, and the other copy then finds
    the task gone (one outcome, the DLQ entry)."""
    client = sync_client(config.current())
    env = producer.prepare(tasks.record.relier_spec, ("o-wait",), {})
    idempotency.store(KEYS, env, env.encode(), 60_000, 3).run(client)
    failure = Failure(Reason.UNKNOWN_TASK, "NotRegistered", "no task here", worker="w:2")
    assert dlq.dead_letter(KEYS, failure, 60_000, env=env, held="queued").run(client).accepted
    assert fencing.start(KEYS, env, "w:1", 10_000).run(client).refusal == "gone"
    assert client.zcard(KEYS.dlq) == 1
