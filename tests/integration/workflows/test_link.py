"""Celery's ``link=`` and ``link_error=`` with relier's guarantees (docs/workflows.md#links):
a callback is created by the script that commits its parent, with the parent's result
first (not for an immutable ``.si()``); an errback is created by the script that files
its parent in the DLQ, with the parent's id first. Each exactly once, through replays,
redeliveries and a SIGKILL of the parent's pool process. Real prefork workers on the
session's private Redis (the replay cases: test_replay.py)."""

from __future__ import annotations

import json

import pytest

import relier_django
from relier_django import dlq
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import limit_tasks, tasks
from testproject.harness import wait_until
from tests.chaos.test_resurrection import FAST, running_pid
from tests.integration.test_limits import (
    RUN,
    _most_at_once,
    _no_limit_keys_left,
    _records,
    _wait_for_start,
)
from tests.leaks import assert_no_leaked_keys

KEYS = KeySpace("rl")


def fences(client, task_id: str) -> list[int]:
    """The fence of each run of a ``demo.step_add`` task."""
    return [int(e.split(b":")[0]) for e in client.lrange(f"demo:exec:step:{task_id}", 0, -1)]


def received(client, task_id: str) -> list:
    """The ``x`` each run of a ``demo.step_add`` task was given."""
    return [json.loads(x) for x in client.lrange(f"demo:step-x:{task_id}", 0, -1)]


def test_a_link_runs_once_with_the_parents_result(worker, redis_client):
    add = tasks.step_add
    parent = add.apply_async((1, 2), link=add.s(10).set(task_id="cb-1"))
    assert relier_django.result("cb-1").get(timeout=30) == 13
    assert parent.get(timeout=5) == 3
    assert (fences(redis_client, "cb-1"), received(redis_client, "cb-1")) == ([1], [3])
    assert fences(redis_client, parent.id) == [1]
    assert_no_leaked_keys(redis_client)


def test_several_links_run_each_once_an_immutable_one_without_the_result(worker, redis_client):
    add = tasks.step_add
    # sig.link() and apply_async(link=[...]) are the same option to Celery.
    sig = add.s(2, 3)
    sig.link(add.s(100).set(task_id="cb-a"))
    sig.link(add.si(7, 1).set(task_id="cb-b"))
    parent = sig.apply_async()
    assert relier_django.result("cb-a").get(timeout=30) == 105
    assert relier_django.result("cb-b").get(timeout=30) == 8
    assert parent.get(timeout=5) == 5
    assert received(redis_client, "cb-b") == [7]  # its own arguments only
    assert [fences(redis_client, i) for i in ("cb-a", "cb-b")] == [[1], [1]]
    assert_no_leaked_keys(redis_client)


def test_a_link_error_runs_once_when_the_parent_is_dead_lettered(worker, redis_client):
    redis_client.set("demo:broken:99", "1")
    add = tasks.step_add
    parent = add.apply_async(
        (1, 99),
        link=add.s(1).set(task_id="never"),
        link_error=tasks.sync_record.s().set(task_id="eb-1"),
    )
    # The errback gets the failed task's id first.
    assert relier_django.result("eb-1").get(timeout=30)["label"] == parent.id
    entry = dlq.store().get(parent.id)
    assert entry is not None and entry.reason == "exception"
    assert len(redis_client.lrange(f"demo:exec:{parent.id}", 0, -1)) == 1  # one errback run
    # The callback is not created for a parent that did not commit.
    assert not redis_client.exists(KEYS.task("never"), KEYS.result("never"))
    assert relier_django.result(parent.id).status == "FAILURE"


def test_a_link_error_runs_for_a_task_the_scanner_files_expired(worker, redis_client):
    # Filed by the scanner leader's dispatch (its expiry passed while it waited for its
    # countdown), not by a worker's run: every way into the DLQ creates the errbacks.
    parent = tasks.step_add.apply_async(
        (1, 2), countdown=2, expires=1, link_error=tasks.sync_record.s().set(task_id="eb-x")
    )
    assert relier_django.result("eb-x").get(timeout=30)["label"] == parent.id
    entry = dlq.store().get(parent.id)
    assert entry is not None and entry.reason == "expired"
    assert fences(redis_client, parent.id) == []  # never ran


def test_a_link_error_survives_the_release_of_its_parent_and_runs_no_second_time(
    worker, redis_client
):
    redis_client.set("demo:broken:98", "1")
    add = tasks.step_add
    parent = add.apply_async(
        (1, 98), link=add.s(1).set(task_id="cb-r"), link_error=tasks.sync_record.si("eb-r")
    )
    entry = wait_until(lambda: dlq.store().get(parent.id), 30, what="the parent's DLQ entry")
    assert entry.envelope["link_error"] and entry.envelope["link"]
    redis_client.delete("demo:broken:98")
    dlq.release_entry(parent.id)
    # Released and committed this time: its link runs, with its result.
    assert relier_django.result("cb-r").get(timeout=30) == 100
    assert len(redis_client.lrange("demo:exec:eb-r", 0, -1)) == 1  # the one failure's


def test_a_link_is_checked_at_push_and_nothing_is_stored(redis_client):
    add = tasks.step_add
    with pytest.raises(TypeError, match="not an @rl_task"):
        add.apply_async((1, 2), link=add.s(1) | add.s(2))
    with pytest.raises(TypeError):  # step_add(x, y, sleep_s): the result and three more
        add.apply_async((1, 2), link=add.s(1, 2, 3))
    with pytest.raises(ValueError, match="task_id"):
        add.apply_async((1, 2), link=add.s(1).set(task_id="has space"))
    assert redis_client.dbsize() == 0


def test_the_parents_pool_process_killed_mid_run_still_runs_its_link_once(
    worker_factory, redis_client
):
    worker = worker_factory(extra_env=FAST)
    client = sync_client(config.current())
    add = tasks.step_add
    parent = add.apply_async(
        (1, 2),
        {"sleep_s": 3.0},
        link=[add.s(10).set(task_id="cb-k"), add.si(5).set(task_id="cb-l")],
    )
    worker.kill_child(running_pid(client, parent.id))  # the parent, mid-run

    assert relier_django.result("cb-k").get(timeout=60) == 13
    assert relier_django.result("cb-l").get(timeout=30) == 5
    assert parent.get(timeout=5) == 3
    # Run again at fence 2 after the kill (the kill may land before fence 1 recorded its
    # run); only fence 2 committed, so the links were created once.
    runs = fences(redis_client, parent.id)
    assert runs[-1] == 2 and runs == sorted(set(runs)), runs
    assert [fences(redis_client, i) for i in ("cb-k", "cb-l")] == [[1], [1]]
    assert received(redis_client, "cb-k") == [3]
    assert_no_leaked_keys(redis_client)


def test_a_callback_with_flow_control_waits_for_its_slot(worker_factory, redis_client):
    """G14 across a link: the callback, created by its parent's commit, goes through its
    own task's limit, so it waits while another task of its key holds the one slot."""
    worker_factory(concurrency=4)
    blocker = limit_tasks.sequence.push(RUN, "w", "blocker", 1.0)
    _wait_for_start(redis_client, "blocker")
    callback = limit_tasks.sequence.si(RUN, "w", "callback", 0.0).set(task_id="lim-cb")
    limit_tasks.per_key.apply_async((RUN, "z", "head", 0.0), link=callback)
    assert relier_django.result("lim-cb").get(timeout=30) == "callback"
    assert blocker.get(timeout=30) == "blocker"
    records = _records(redis_client)
    assert _most_at_once(records)["w"] == 1, records
    starts = [label for kind, _, label, _, _ in records if kind == "start"]
    assert starts.index("callback") > starts.index("blocker")
    _no_limit_keys_left(redis_client)


def test_links_and_errbacks_run_in_eager_mode(settings, redis_client):
    settings.RELIER = {**settings.RELIER, "EAGER": True}
    add = tasks.step_add
    parent = add.apply_async((1, 2), link=[add.s(10).set(task_id="e-cb"), add.si(4)])
    assert parent.get() == 3
    # Once each, in this process (an eager run holds fence 1), the result first.
    assert (fences(redis_client, "e-cb"), received(redis_client, "e-cb")) == ([1], [3])
    redis_client.set("demo:broken:97", "1")
    failed = add.apply_async((1, 97), link_error=tasks.sync_record.s())
    assert failed.status == "FAILURE"
    assert len(redis_client.lrange(f"demo:exec:{failed.id}", 0, -1)) == 1  # given its id
    assert not redis_client.keys("rl:*")  # eager mode never touched relier's store
