"""Chains and ``link=`` on a partitioned store (PARTITIONS = 4 on the session's private
Redis; docs/scaling.md): a step's commit records a hand-over in its own partition, the
worker stores the next task in the next task's partition right after, and the scanner
leader's sweep does it for a worker that died in between (store/handover.py). Each
step and callback runs exactly once (G1, G13), every script is safe to replay
(test_replay.py) and to race (here). Real prefork workers for the behaviour; the
hand-over's scripts are driven directly for the races and the sweep."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator

import pytest
from celery import chain, chord

import relier_django
from relier_django import dlq
from relier_django.core.model import config
from relier_django.core.model.envelope import Envelope
from relier_django.core.store import handover
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import process_pointed_at, wait_until
from tests.chaos.test_resurrection import FAST
from tests.integration.workflows.test_chord import relier_backend  # noqa: F401 (a fixture)
from tests.integration.workflows.test_link import fences, received
from tests.leaks import assert_no_leaked_keys

PARTITIONED = {"RELIER_PARTITIONS": "4"}


@pytest.fixture
def partitioned(redis_client) -> Iterator[KeySpace]:
    """This process configured for a 4-partition store on the (flushed) private Redis."""
    with process_pointed_at(PARTITIONED):
        yield KeySpace.of(config.current())
    # Not left laid out for 4 partitions (relier.E015) for a later test that does not
    # flush first.
    redis_client.flushall()


@pytest.fixture
def pworker(partitioned, worker_factory):
    return worker_factory(extra_env={**PARTITIONED, **FAST})


def id_in(keys: KeySpace, partition: int) -> str:
    """A fresh task id in ``partition``."""
    return keys.new_id(near=keys.at(partition).expiry)


def no_hand_over_left(client, keys: KeySpace) -> bool:
    return not any(client.exists(p.handovers, p.handover_records) for p in keys.parts())


def test_a_chain_across_every_partition_runs_each_step_once_in_order(
    pworker, partitioned, redis_client
):
    keys, add = partitioned, tasks.step_add
    ids = [id_in(keys, k) for k in (0, 1, 2, 3, 1)]
    steps = [add.s(1, 1).set(task_id=ids[0])]
    steps += [add.s(10**k).set(task_id=ids[k]) for k in range(1, 5)]
    result = chain(*steps).apply_async()
    assert result.id == ids[-1]
    assert relier_django.result(ids[-1]).get(timeout=30) == 11112
    assert [fences(redis_client, i) for i in ids] == [[1]] * 5
    assert [received(redis_client, i) for i in ids] == [[1], [2], [12], [112], [1112]]
    # Each step after the first was stored by its predecessor's hand-over.
    assert [redis_client.get(keys.handed(i)) for i in ids[1:]] == [i.encode() for i in ids[:-1]]
    assert no_hand_over_left(redis_client, keys)
    assert_no_leaked_keys(redis_client, keys)


def test_an_async_step_hands_its_successor_over_too(pworker, partitioned, redis_client):
    keys, record = partitioned, tasks.record  # an async def task: the runner's other path
    first, second = id_in(keys, 0), id_in(keys, 3)
    chain(record.si("async-a").set(task_id=first), record.si("async-b").set(task_id=second)).delay()
    assert relier_django.result(second).get(timeout=30)["label"] == "async-b"
    assert redis_client.get(keys.handed(second)) == first.encode()
    assert [len(redis_client.lrange(f"demo:exec:async-{x}", 0, -1)) for x in "ab"] == [1, 1]
    assert no_hand_over_left(redis_client, keys)


def test_a_broken_step_waits_in_the_dlq_and_its_release_resumes_the_chain(
    pworker, partitioned, redis_client
):
    keys, add = partitioned, tasks.step_add
    redis_client.set("demo:broken:3", 1)
    first, middle, last = id_in(keys, 0), id_in(keys, 1), id_in(keys, 2)
    chain(add.s(1, 2).set(task_id=first), add.s(3).set(task_id=middle),
          add.s(4).set(task_id=last)).apply_async()  # fmt: skip
    wait_until(lambda: dlq.store().get(middle), 30, what="the broken step in the DLQ")
    view = relier_django.workflow(first)
    assert view is not None and [s.task_id for s in view.steps] == [first, middle, last]
    assert [s.status.state for s in view.steps] == ["SUCCESS", "FAILURE", "PENDING"]
    redis_client.delete("demo:broken:3")
    dlq.release_entry(middle)
    assert relier_django.result(last).get(timeout=30) == 10
    assert [fences(redis_client, i) for i in (first, last)] == [[1], [1]]
    assert redis_client.get(keys.handed(last)) == middle.encode()
    view = relier_django.workflow(first)
    assert view is not None and view.state == "SUCCESS" and len(view.done) == 3
    assert no_hand_over_left(redis_client, keys)


def test_links_in_other_partitions_run_once_with_the_parents_result(
    pworker, partitioned, redis_client
):
    keys, add = partitioned, tasks.step_add
    first, second = id_in(keys, 1), id_in(keys, 2)
    parent = add.apply_async(
        (2, 3), task_id=id_in(keys, 0),
        link=[add.s(100).set(task_id=first), add.si(7, 1).set(task_id=second)],
    )  # fmt: skip
    assert relier_django.result(first).get(timeout=30) == 105
    assert relier_django.result(second).get(timeout=30) == 8
    assert parent.get(timeout=5) == 5
    assert [fences(redis_client, i) for i in (parent.id, first, second)] == [[1]] * 3
    assert redis_client.get(keys.handed(first)) == redis_client.get(keys.handed(second))
    assert redis_client.get(keys.handed(first)) == parent.id.encode()
    assert no_hand_over_left(redis_client, keys)
    assert_no_leaked_keys(redis_client, keys)


def test_errbacks_in_other_partitions_run_once_with_the_failed_tasks_id(
    pworker, partitioned, redis_client
):
    keys, add = partitioned, tasks.step_add
    redis_client.set("demo:broken:99", "1")
    errback = id_in(keys, 3)
    parent = add.apply_async(
        (1, 99), task_id=id_in(keys, 1), link=add.s(1).set(task_id=id_in(keys, 2)),
        link_error=tasks.sync_record.s().set(task_id=errback),
    )  # fmt: skip
    assert relier_django.result(errback).get(timeout=30)["label"] == parent.id
    assert len(redis_client.lrange(f"demo:exec:{parent.id}", 0, -1)) == 1  # one errback run
    assert redis_client.get(keys.handed(errback)) == f"{parent.id}:dead:1".encode()
    assert dlq.store().get(parent.id).reason == "exception"
    assert no_hand_over_left(redis_client, keys)


def test_an_errback_of_a_task_the_scanner_files_is_handed_over_by_the_sweep(
    pworker, partitioned, redis_client
):
    # Filed by the scanner leader's dispatch (expired while it waited for its
    # countdown): no worker completes that hand-over, the sweep does.
    keys, errback = partitioned, id_in(partitioned, 2)
    parent = tasks.step_add.apply_async(
        (1, 2), task_id=id_in(keys, 0), countdown=2, expires=1,
        link_error=tasks.sync_record.s().set(task_id=errback),
    )  # fmt: skip
    assert relier_django.result(errback).get(timeout=30)["label"] == parent.id
    assert dlq.store().get(parent.id).reason == "expired"
    assert fences(redis_client, parent.id) == []  # never ran
    assert redis_client.get(keys.handed(errback)) == f"{parent.id}:dead:1".encode()
    assert no_hand_over_left(redis_client, keys)


@pytest.mark.usefixtures("relier_backend")
def test_a_chord_across_partitions_runs_its_callback_once_with_every_result_in_order(
    pworker, partitioned, redis_client
):
    keys, add = partitioned, tasks.step_add
    header = [add.s(i, 100).set(task_id=id_in(keys, i % 4)) for i in range(6)]
    result = chord(header)(tasks.step_sum.s(1000).set(task_id=id_in(keys, 2)))
    assert result.get(timeout=30) == 1000 + sum(range(100, 106))
    assert received(redis_client, result.id) == [list(range(100, 106))]
    assert fences(redis_client, result.id) == [1]  # the callback ran once
    assert [fences(redis_client, m.id) for m in header] == [[1]] * 6
    group = result.parent.id
    # Stored by the hand-over of the member that completed the header.
    assert redis_client.get(keys.handed(result.id)) == f"{group}:callback".encode()
    assert not redis_client.exists(keys.chord(group))  # dropped after the callback
    assert no_hand_over_left(redis_client, keys)
    assert_no_leaked_keys(redis_client, keys)


def _member_record(keys: KeySpace, group: str, index: int, callback: str) -> str:
    env = Envelope(id=callback, task="demo.step_sum", header=group, fence=1)
    handed = handover.Handed(callback, env.encode(), env.task, "", 5)
    return handover.record([], 60_000, handover.Member(group, index, json.dumps(index), handed))


def test_racing_completions_of_every_member_fire_the_chords_callback_once(
    partitioned, redis_client
):
    keys = partitioned
    group, callback = id_in(keys, 1), id_in(keys, 3)
    members = [id_in(keys, k % 4) for k in range(4)]
    redis_client.hset(keys.chord(group), "size", 4)  # as the producer writes it
    records = [_member_record(keys, group, i, callback) for i in range(4)]
    client = sync_client(config.current())
    gate = threading.Barrier(8)

    def complete(i: int) -> None:
        gate.wait()  # each member's hand-over completed twice at once (worker, sweep)
        handover.complete(client, keys, members[i % 4], records[i % 4])

    threads = [threading.Thread(target=complete, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    part = keys.of_task(callback)
    assert redis_client.hget(part.task(callback), "state") == b"scheduled"
    assert redis_client.hget(part.metrics_counters, "pushed") == b"1"  # stored once
    state = redis_client.hgetall(keys.chord(group))
    assert state[b"fired"] in {m.encode() for m in members}
    assert [json.loads(state[f"r:{i}".encode()]) for i in range(4)] == [0, 1, 2, 3]
    assert no_hand_over_left(redis_client, keys)


def _record_as_commit_would(client, keys: KeySpace, token: str, successor: str, at_ms: int):
    """The hand-over record commit.lua writes for ``token`` (a committed step) whose
    chain goes on with ``successor`` (a demo.step_add of 1 + 2)."""
    env = {"id": successor, "task": "demo.step_add", "args": [1, 2], "fence": 1}
    stored = handover.record(
        [handover.Handed(successor, json.dumps(env), "demo.step_add", "", 5)], 60_000
    )
    part = keys.of_task(token)
    client.zadd(part.handovers, {token: at_ms})
    client.hset(part.handover_records, token, stored)
    return stored


def _now_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_racing_completions_of_one_hand_over_store_its_successor_once(partitioned, redis_client):
    keys = partitioned
    token, successor = id_in(keys, 0), id_in(keys, 3)
    stored = _record_as_commit_would(redis_client, keys, token, successor, _now_ms(redis_client))
    client = sync_client(config.current())
    gate = threading.Barrier(8)
    answers: list[int] = []

    def complete() -> None:
        gate.wait()
        answers.append(handover.complete(client, keys, token, stored))

    threads = [threading.Thread(target=complete) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    part = keys.of_task(successor)
    assert answers == [1] * 8  # each finds it stored by this hand-over
    assert redis_client.hget(part.task(successor), "state") == b"scheduled"
    assert redis_client.zscore(part.schedule, successor) is not None
    assert redis_client.hget(part.metrics_counters, "pushed") == b"1"  # stored once
    assert redis_client.get(part.handed(successor)) == token.encode()
    assert no_hand_over_left(redis_client, keys)


def test_a_late_completion_never_recreates_a_successor_that_committed(partitioned, redis_client):
    keys = partitioned
    token, successor = id_in(keys, 1), id_in(keys, 2)
    stored = _record_as_commit_would(redis_client, keys, token, successor, _now_ms(redis_client))
    client = sync_client(config.current())
    part = keys.of_task(successor)
    assert handover.complete(client, keys, token, stored) == 1
    # The successor ran and committed: its task hash is gone, its result is there.
    redis_client.delete(part.task(successor))
    redis_client.zrem(part.schedule, successor)
    redis_client.set(part.result(successor), "{}")
    assert handover.complete(client, keys, token, stored) == 1  # by its marker: no store
    redis_client.delete(part.handed(successor))  # the marker gone, the result still there
    assert handover.complete(client, keys, token, stored) == 0
    assert not redis_client.exists(part.task(successor))
    assert redis_client.hget(part.metrics_counters, "pushed") == b"1"


def test_a_handed_over_successor_is_noted_once_in_its_partitions_audit_ledger(
    partitioned, redis_client
):
    keys = dataclasses.replace(partitioned, ledger_ms=60_000)  # AUDIT_HORIZON_S on
    token, successor = id_in(keys, 0), id_in(keys, 1)
    stored = _record_as_commit_would(redis_client, keys, token, successor, _now_ms(redis_client))
    client = sync_client(config.current())
    assert handover.complete(client, keys, token, stored) == 1
    assert handover.complete(client, keys, token, stored) == 1  # a second completion
    ledger = keys.of_task(successor).ledger
    assert [f[b"p"] for _, f in redis_client.xrange(ledger)] == [successor.encode()]


def test_the_sweep_completes_old_hand_overs_and_leaves_fresh_ones_to_their_worker(
    partitioned, redis_client
):
    keys = partitioned
    now = _now_ms(redis_client)
    old, old_next = id_in(keys, 2), id_in(keys, 0)
    fresh, fresh_next = id_in(keys, 3), id_in(keys, 1)
    _record_as_commit_would(redis_client, keys, old, old_next, now - handover.GRACE_MS - 1)
    _record_as_commit_would(redis_client, keys, fresh, fresh_next, now)
    client = sync_client(config.current())
    assert handover.sweep(client, keys, now) == 1
    assert redis_client.hget(keys.task(old_next), "state") == b"scheduled"
    assert not redis_client.exists(keys.task(fresh_next))
    assert not redis_client.hexists(keys.of_task(old).handover_records, old)
    assert redis_client.hexists(keys.of_task(fresh).handover_records, fresh)
    assert handover.sweep(client, keys, now) == 0  # nothing old left


def test_an_unreadable_record_is_kept_and_does_not_hold_up_the_sweep(partitioned, redis_client):
    keys = partitioned
    now = _now_ms(redis_client)
    bad, good, good_next = id_in(keys, 0), id_in(keys, 0), id_in(keys, 1)
    part = keys.of_task(bad)
    redis_client.zadd(part.handovers, {bad: now - handover.GRACE_MS - 2})
    redis_client.hset(part.handover_records, bad, "not json")
    _record_as_commit_would(redis_client, keys, good, good_next, now - handover.GRACE_MS - 1)
    client = sync_client(config.current())
    assert handover.sweep(client, keys, now) == 1
    assert redis_client.hget(keys.task(good_next), "state") == b"scheduled"
    assert redis_client.hget(part.handover_records, bad) == b"not json"  # for an operator


def test_a_swept_successor_is_dispatched_and_runs_once(pworker, partitioned, redis_client):
    keys = partitioned
    token, successor = id_in(keys, 0), id_in(keys, 2)
    env = Envelope(id=successor, task="demo.step_add", args=(1, 2), kwargs={}, fence=1)
    signer = config.current().signer
    stored = handover.record(
        [handover.Handed(successor, env.encode(signer), env.task, "", 5)], 60_000
    )
    part = keys.of_task(token)
    redis_client.zadd(part.handovers, {token: _now_ms(redis_client) - handover.GRACE_MS - 1})
    redis_client.hset(part.handover_records, token, stored)
    # No worker completes it: the embedded scanner's sweep does, and the leader runs it.
    assert relier_django.result(successor).get(timeout=30) == 3
    assert fences(redis_client, successor) == [1]
    wait_until(lambda: no_hand_over_left(redis_client, keys), 10, what="the record forgotten")


def test_a_nested_canvas_is_refused_at_push_and_nothing_is_stored(
    partitioned,
    redis_client,
    relier_backend,  # noqa: F811 (the fixture imported above)
):
    add = tasks.step_add
    with pytest.raises(TypeError, match="not supported on a partitioned store"):
        chain(add.s(1, 1), chord([add.s(1), add.s(2)], tasks.step_sum.s(3)), add.s(4)).apply_async()
    with pytest.raises(TypeError, match="not supported on a partitioned store"):
        chord([chain(add.s(1, 1), add.s(2)), add.s(2, 2)])(tasks.step_sum.s(0))
    assert not [k for k in redis_client.keys("rl:*") if b":t:" in k]
