"""Chains and groups (chords: test_chord.py) with relier's guarantees
(docs/workflows.md): Celery's own canvas API (``chain()``, ``|``, ``.s()``, ``.si()``,
``group()``) over ``@rl_task`` signatures, run by real workers on the session's private
Redis. Each step's commit creates the next step in the same script, so the chain ends
once with the right result; a failing step waits in the DLQ with the rest of the chain,
and releasing it resumes the chain."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from celery import chain, group

import relier_django
from relier_django import dlq
from relier_django.core.model.envelope import decode
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until
from tests.integration.workflows.test_chord import relier_backend  # noqa: F401 (a fixture)
from tests.leaks import assert_no_leaked_keys

KEYS = KeySpace("rl")


def runs(client, task_id: str) -> list[str]:
    """One entry per run of a ``demo.step_add`` step (its fence and worker)."""
    return [e.decode().split(":", 1)[0] for e in client.lrange(f"demo:exec:step:{task_id}", 0, -1)]


def test_a_chain_runs_each_step_once_passing_each_result_on(worker, redis_client):
    add = tasks.step_add
    last = chain(add.s(1, 2), add.s(3), add.si(10, 5), add.s(100)).apply_async()
    ids = [r.id for r in reversed(list(_results(last)))]
    assert relier_django.result(last.id).get(timeout=30) == 115
    # Each step's result: 1+2, then +3, then 10+5 (immutable: no previous result), then +100.
    assert [relier_django.result(i).get(timeout=5) for i in ids] == [3, 6, 15, 115]
    assert [runs(redis_client, i) for i in ids] == [["1"]] * 4  # once each, at fence 1
    assert [received(redis_client, i) for i in ids] == [[1], [3], [10], [15]]
    assert_no_leaked_keys(redis_client)


def received(client, task_id: str) -> list[int]:
    """The ``x`` each run of a ``demo.step_add`` step got."""
    return [json.loads(x) for x in client.lrange(f"demo:step-x:{task_id}", 0, -1)]


def test_the_pipe_operator_and_delay_build_the_same_chain(worker, redis_client):
    add = tasks.step_add
    result = (add.s(1, 1) | add.s(1) | add.s(1)).delay()
    assert relier_django.result(result.id).get(timeout=30) == 4


def test_each_step_is_created_by_the_commit_of_the_one_before(redis_client):
    # No worker: the first step is stored; the others exist only in its envelope.
    add = tasks.step_add
    last = chain(add.s(1, 2), add.s(3), add.s(4)).apply_async()
    first, second = [r.id for r in reversed(list(_results(last)))][:2]
    assert redis_client.exists(KEYS.task(first))
    assert not redis_client.exists(KEYS.task(second)) and not redis_client.exists(
        KEYS.task(last.id)
    )
    env = decode(redis_client.hget(KEYS.task(first), "env"))
    assert env.workflow == first and env.v == 2
    assert [step["id"] for step in env.chain] == [second, last.id]


def test_a_failing_step_waits_in_the_dlq_with_the_rest_and_release_resumes_it(worker, redis_client):
    add = tasks.step_add
    redis_client.set("demo:broken:3", 1)
    last = chain(add.s(1, 2), add.s(3), add.s(4)).apply_async()
    first, middle = [r.id for r in reversed(list(_results(last)))][:2]
    entry = wait_until(lambda: dlq.store().get(middle), 30, what="the broken step in the DLQ")
    envelope = entry.envelope
    assert envelope["workflow"] == first  # the workflow's identity
    assert [step["id"] for step in envelope["chain"]] == [last.id]  # the rest waits with it
    assert not redis_client.exists(KEYS.task(last.id))  # never created
    redis_client.delete("demo:broken:3")
    dlq.release_entry(middle)
    assert relier_django.result(last.id).get(timeout=30) == 10
    assert runs(redis_client, first) == ["1"] and runs(redis_client, last.id) == ["1"]


def test_a_plain_celery_task_in_a_chain_is_refused_and_nothing_is_pushed(redis_client):
    with pytest.raises(TypeError, match="is not an @rl_task"):
        chain(tasks.step_add.s(1, 2), tasks.plain_record.s()).apply_async()
    assert redis_client.dbsize() == 0


def test_a_step_whose_own_arguments_cannot_fit_is_refused_at_push(redis_client):
    with pytest.raises(TypeError):
        chain(tasks.step_add.s(1, 2), tasks.step_add.s(1, 2, 3)).apply_async()
    assert redis_client.dbsize() == 0


def test_a_group_pushes_each_member_once_under_the_groups_identity(worker, redis_client):
    add = tasks.step_add
    redis_client.set("demo:broken:99", 1)
    members = [add.s(i, 10) for i in range(4)] + [add.s(0, 99)]
    result = group(members).apply_async()
    ids = [r.id for r in result.results]
    assert [relier_django.result(i).get(timeout=30) for i in ids[:4]] == [10, 11, 12, 13]
    assert [runs(redis_client, i) for i in ids[:4]] == [["1"]] * 4
    # A member that fails lands in the DLQ under the group's identity.
    entry = wait_until(lambda: dlq.store().get(ids[4]), 30, what="the broken member in the DLQ")
    assert entry.envelope["workflow"] == result.id


def test_a_group_of_chains_runs_every_chain_once(worker, redis_client):
    add = tasks.step_add
    result = group(chain(add.s(i, 1), add.s(1), add.s(1)) for i in range(3)).apply_async()
    assert [relier_django.result(r.id).get(timeout=30) for r in result.results] == [3, 4, 5]


def test_an_idempotent_chain_head_whose_key_is_claimed_still_runs_the_whole_chain(
    worker, redis_client
):
    """Deduplicated onto the earlier push, the head would never run under the id the
    chain froze for it, and its rest (carried in its envelope) would never be created
    (issue 35). A workflow's member claims no key: it runs under its frozen id."""
    once = tasks.step_once
    alone = once.push(5, 1)
    assert alone.get(timeout=30) == 6
    result = chain(once.s(5, 1), tasks.step_add.s(1)).apply_async()
    assert relier_django.result(result.id).get(timeout=30) == 7
    head = result.parent.id
    assert redis_client.lrange("demo:once:5:1", 0, -1) == [alone.task_id.encode(), head.encode()]


def test_idempotent_group_members_with_one_key_each_run_under_their_own_ids(worker, redis_client):
    """Two members with one key, and a key already claimed by a push still running:
    every member's frozen id gets its result (group.get() would otherwise hang)."""
    once = tasks.step_once
    held = once.push(3, 0)  # claims the key; its result is cached once it commits
    result = group(once.s(3, 0), once.s(3, 0), once.s(4, 0)).apply_async()
    assert [relier_django.result(r.id).get(timeout=30) for r in result.results] == [3, 3, 4]
    assert held.get(timeout=30) == 3
    assert redis_client.llen("demo:once:3:0") == 3  # the push and both members


def test_a_cancelled_step_files_the_rest_of_its_chain_in_the_dlq_and_release_resumes_it(
    worker, redis_client
):
    """Removed, a cancelled step would end its chain without a trace: its envelope carries
    the rest (issue 35). It is filed in the DLQ, reason cancelled, with the rest."""
    add = tasks.step_add
    result = chain(add.s(1, 1).set(countdown=60), add.s(1), add.s(1)).apply_async()
    head = result.parent.parent.id
    assert relier_django.cancel(head) is relier_django.Cancelled.BEFORE_START
    entry = dlq.store().get(head)
    assert entry is not None and entry.reason == "cancelled"
    assert [step["id"] for step in entry.envelope["chain"]] == [result.parent.id, result.id]
    assert relier_django.result(head).status == "REVOKED"
    assert relier_django.workflow(head).state == "REVOKED"  # not PENDING: it waits in the DLQ
    dlq.release_entry(head)
    assert relier_django.result(result.id).get(timeout=30) == 4
    assert dlq.store().get(head) is None


def test_a_chain_step_with_a_link_of_its_own_is_refused_at_push(redis_client):
    # link= on a task is supported (tests/integration/workflows/test_link.py); on a later
    # step of a chain (where Celery puts a chain's own link) it is not yet, and says so.
    with pytest.raises(TypeError, match="link= or link_error= of its own"):
        chain(tasks.step_add.s(1, 2), tasks.step_add.s(3).on_error(tasks.sync_record.s()))()
    assert redis_client.dbsize() == 0


def test_a_chain_runs_whole_in_eager_mode(settings, redis_client):
    settings.RELIER = {**settings.RELIER, "EAGER": True}
    add = tasks.step_add
    last = chain(add.s(1, 2), add.s(3), add.si(7, 1), add.s(5)).apply_async()
    ids = [r.id for r in reversed(list(_results(last)))]
    # Each step ran once, in this process (fence 1, as a worker's first incarnation
    # holds), given the previous result (the immutable step its own arguments).
    assert [runs(redis_client, i) for i in ids] == [["1"]] * 4
    assert [received(redis_client, i) for i in ids] == [[1], [3], [7], [8]]
    assert not redis_client.keys("rl:*")  # eager mode never touched relier's store


def _results(last):
    """The chain's results, last step first (Celery links each to its parent)."""
    node = last
    while node is not None:
        yield node
        node = node.parent


def test_a_workflow_is_readable_by_its_id_step_by_step(worker, redis_client):
    add = tasks.step_add
    redis_client.set("demo:broken:3", 1)
    last = chain(add.s(1, 2), add.s(3), add.s(4)).apply_async()
    first, middle, _ = [r.id for r in reversed(list(_results(last)))]
    wait_until(lambda: dlq.store().get(middle), 30, what="the broken step in the DLQ")
    view = relier_django.workflow(first)
    assert view is not None and view.kind == "chain"
    assert [s.task_id for s in view.steps] == [first, middle, last.id]
    assert [s.status.state for s in view.steps] == ["SUCCESS", "FAILURE", "PENDING"]
    assert (view.state, len(view.done), len(view.failed), len(view.pending)) == ("FAILURE", 1, 1, 1)
    redis_client.delete("demo:broken:3")
    dlq.release_entry(middle)
    relier_django.result(last.id).get(timeout=30)
    view = relier_django.workflow(first)
    assert view is not None and view.state == "SUCCESS" and len(view.done) == 3


def test_a_groups_members_are_readable_under_the_group_id(worker, redis_client):
    result = group(tasks.step_add.s(i, 1) for i in range(3)).apply_async()
    for r in result.results:
        relier_django.result(r.id).get(timeout=30)
    view = relier_django.workflow(result.id)
    assert view is not None and view.kind == "group" and view.state == "SUCCESS"
    assert [s.task_id for s in view.steps] == [r.id for r in result.results]
    assert relier_django.workflow("no-such-workflow") is None


def test_a_group_applied_while_the_producer_pool_is_nearly_empty_does_not_deadlock(
    worker, redis_client
):
    """Celery's group holds one producer of the app's pool while it applies each member
    and passes it on (``apply_async(producer=...)``). A member's push must send with
    that producer: taking a second from the pool deadlocks as soon as as many threads
    as the pool holds apply groups at once (here: every producer but one is taken, so
    one group shows it)."""
    pool = app.producer_pool
    taken = [pool.acquire(block=True) for _ in range(pool.limit - 1)]
    done = threading.Event()
    results: list[Any] = []

    def apply() -> None:
        results.append(group(tasks.step_add.s(i, 1) for i in range(2)).apply_async())
        done.set()

    applying = threading.Thread(target=apply, daemon=True)
    try:
        applying.start()
        finished = done.wait(20)
    finally:
        for producer in taken:
            producer.release()
        applying.join(30)
    assert finished, "the group's apply waited for a second producer from an empty pool"
    assert [relier_django.result(r.id).get(timeout=30) for r in results[0].results] == [1, 2]


def test_a_group_ending_a_chain_runs_each_member_once_given_the_last_result(worker, redis_client):
    add = tasks.step_add
    # As Celery: each member gets the previous step's result first (not the .si() one).
    members = group(add.s(10), add.s(20), add.si(7, 0))
    result = chain(add.s(1, 1), add.s(1), members).apply_async()
    ids = [r.id for r in result.results]
    assert [relier_django.result(i).get(timeout=30) for i in ids] == [13, 23, 7]
    assert [received(redis_client, i) for i in ids] == [[3], [3], [7]]
    assert [runs(redis_client, i) for i in ids] == [["1"]] * 3
    assert_no_leaked_keys(redis_client)


def test_a_group_right_after_the_first_task_becomes_its_callbacks(redis_client):
    # No worker: the members are created by the first task's commit, not by the push.
    add = tasks.step_add
    result = chain(add.s(1, 1), group(add.s(1), add.s(2))).apply_async()
    ids = [r.id for r in result.results]
    assert not any(redis_client.exists(KEYS.task(i)) for i in ids)
    (first,) = [k.decode().split("{")[1].rstrip("}") for k in redis_client.keys("rl:t:*")]
    env = decode(redis_client.hget(KEYS.task(first), "env"))
    assert [step["id"] for step in env.link] == ids and env.chain == ()


def test_a_group_ending_a_chain_runs_whole_in_eager_mode(settings, redis_client):
    settings.RELIER = {**settings.RELIER, "EAGER": True}
    add = tasks.step_add
    result = chain(add.s(1, 1), add.s(1), group(add.s(10), add.s(20))).apply_async()
    assert [received(redis_client, r.id) for r in result.results] == [[3], [3]]
    assert not redis_client.keys("rl:*")


@pytest.mark.usefixtures("relier_backend")
def test_a_group_in_the_middle_of_a_chain_is_a_chord_whose_callback_goes_on(worker, redis_client):
    add = tasks.step_add
    # Celery makes group(...) followed by a step a chord whose callback is that step.
    last = chain(
        add.s(1, 1),  # 2
        add.s(1),  # 3
        group(add.s(10, sleep_s=0.3), add.s(20), add.si(7, 0)),  # 13, 23, 7
        tasks.step_sum.s(100),  # 143
        add.s(5),  # 148
    ).apply_async()
    assert relier_django.result(last.id).get(timeout=30) == 148
    ids = [r.id for r in reversed(list(_results(last)))]
    callback = ids[-2]
    assert received(redis_client, callback) == [[13, 23, 7]]  # in header order, once
    assert [runs(redis_client, i) for i in (ids[0], ids[1], callback, last.id)] == [["1"]] * 4
    view = relier_django.workflow(ids[0])
    assert view is not None and view.state == "SUCCESS" and len(view.steps) == 7
    assert_no_leaked_keys(redis_client)


@pytest.mark.usefixtures("relier_backend")
def test_a_chord_in_a_chain_exists_only_once_the_step_before_commits(redis_client):
    # No worker: only the first step exists; its envelope carries the header as the
    # callbacks of the step before the group, each with its place and the header's size.
    add = tasks.step_add
    chain(add.s(1, 1), group(add.s(1), add.s(2)), tasks.step_sum.s(0)).apply_async()
    (first,) = [k.decode().split("{")[1].rstrip("}") for k in redis_client.keys("rl:t:*")]
    env = decode(redis_client.hget(KEYS.task(first), "env"))
    places = [member["chord"] for member in env.link]
    assert [p["index"] for p in places] == [0, 1] and {p["size"] for p in places} == {2}
    assert not redis_client.keys("rl:ch:*")  # the size is recorded by that commit


@pytest.mark.usefixtures("relier_backend")
def test_a_failing_member_of_a_chord_in_a_chain_holds_the_rest_until_released(worker, redis_client):
    redis_client.set("demo:broken:7", 1)
    add = tasks.step_add
    last = chain(
        add.s(1, 1), group(add.s(1), add.s(7)), tasks.step_sum.s(0), add.s(1)
    ).apply_async()
    first = next(r.id for r in reversed(list(_results(last))))
    relier_django.result(first).get(timeout=30)
    broken = wait_until(
        lambda: [e for e in dlq.store().iter() if e.envelope.get("chord")],
        30,
        what="the broken member in the DLQ",
    )[0]
    assert not redis_client.exists(KEYS.task(last.id))
    redis_client.delete("demo:broken:7")
    dlq.release_entry(broken.id)
    assert relier_django.result(last.id).get(timeout=30) == 3 + 9 + 1


@pytest.mark.usefixtures("relier_backend")
def test_a_chord_in_a_chain_runs_under_celery_eager_and_relier_eager_refuses_it(
    settings, redis_client
):
    add = tasks.step_add
    flow = chain(add.s(1, 1), group(add.s(1), add.s(2)), tasks.step_sum.s(0))
    app.conf.task_always_eager = True
    try:
        assert flow.apply_async().get() == 3 + 4  # Celery's own eager canvas
    finally:
        app.conf.task_always_eager = False
    settings.RELIER = {**settings.RELIER, "EAGER": True}
    with pytest.raises(TypeError, match="CELERY_TASK_ALWAYS_EAGER"):
        flow.apply_async()
    assert not redis_client.keys("rl:t:*")  # refused before anything ran or was stored


@pytest.mark.usefixtures("relier_backend")
def test_a_cancelled_step_before_a_group_files_the_chord_with_it_and_release_resumes_it(
    worker, redis_client
):
    # chain(a, group, d): a has no chain after it, only the header it opens; removed, it
    # would end the workflow without a trace.
    add = tasks.step_add
    last = chain(
        add.s(1, 1).set(countdown=60), group(add.s(1), add.s(2)), tasks.step_sum.s(0)
    ).apply_async()
    head = next(r.id for r in reversed(list(_results(last))))
    assert relier_django.cancel(head) is relier_django.Cancelled.BEFORE_START
    entry = dlq.store().get(head)
    assert entry is not None and entry.reason == "cancelled"
    assert [m["chord"]["index"] for m in entry.envelope["link"]] == [0, 1]
    dlq.release_entry(head)
    assert relier_django.result(last.id).get(timeout=30) == 3 + 4
