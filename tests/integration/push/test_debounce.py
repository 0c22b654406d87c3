"""Debounce (issue 38): ``push_with(debounce_s=..., debounce_key=...)``. Of a burst of
pushes of one key within the quiet window, only the last runs, exactly once, with its
own arguments; every earlier one ends as superseded (``TaskSuperseded``, Celery's
``REVOKED``), never silently; a push after the waiting task was dispatched starts a new
window; no key is left behind. Real Redis and real prefork workers."""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest
from celery import states

from relier_django import TaskSuperseded, result
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import wait_until
from tests.leaks import assert_no_leaked_keys

KEYS = KeySpace("rl")


def runs(client, label: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.decode() for r in client.lrange(f"demo:exec:{label}", 0, -1)]


def _superseded_by(task_id: str) -> str:
    with pytest.raises(TaskSuperseded) as ended:
        result(task_id).get(timeout=5)
    assert ended.value.reason == "superseded"
    assert result(task_id).status == states.REVOKED
    return ended.value.superseded_by


def _no_debounce_keys(client) -> None:  # type: ignore[no-untyped-def]
    wait_until(lambda: not list(client.scan_iter("rl:db:*")), 10, what="debounce records gone")
    assert_no_leaked_keys(client)


def test_a_burst_within_the_window_runs_only_the_last_push_once_with_its_arguments(
    worker, redis_client
):
    debounced = tasks.sync_record.push_with(debounce_s=3, debounce_key="search:42")
    receipts = [debounced.push(f"burst-{i}") for i in range(5)]
    last = receipts[-1]
    # Waiting in the schedule index, one task only: the earlier ones are gone from it.
    assert redis_client.zcard(KEYS.schedule) == 1
    assert redis_client.zscore(KEYS.schedule, last.task_id) is not None
    assert last.get(timeout=30)["label"] == "burst-4"
    # Each one superseded by the push that followed it.
    for earlier, later in itertools.pairwise(receipts):
        assert _superseded_by(earlier.task_id) == later.task_id
    assert len(runs(redis_client, "burst-4")) == 1
    assert all(runs(redis_client, f"burst-{i}") == [] for i in range(4))
    _no_debounce_keys(redis_client)


def test_the_default_key_is_the_task_s_arguments(worker, redis_client):
    first = tasks.sync_record.push_with(debounce_s=2).push("same")
    second = tasks.sync_record.push_with(debounce_s=2).push("same")
    other = tasks.sync_record.push_with(debounce_s=2).push("other")
    assert second.get(timeout=30)["label"] == "same"
    assert other.get(timeout=30)["label"] == "other"
    assert _superseded_by(first.task_id) == second.task_id
    assert len(runs(redis_client, "same")) == 1
    _no_debounce_keys(redis_client)


def test_a_push_after_the_waiting_task_was_dispatched_starts_a_new_window(worker, redis_client):
    debounced = tasks.sync_record.push_with(debounce_s=0.5, debounce_key="k")
    first = debounced.push("window-1")
    assert first.get(timeout=30)["label"] == "window-1"
    second = debounced.push("window-2")
    assert second.get(timeout=30)["label"] == "window-2"
    assert result(first.task_id).get(timeout=5)["label"] == "window-1"  # not superseded
    assert len(runs(redis_client, "window-1")) == 1
    _no_debounce_keys(redis_client)


def test_two_producers_pushing_at_once_leave_one_winner_and_supersede_every_other(
    worker, redis_client
):
    """Two threads, 20 pushes each, of one key: the store serialises them (push.lua is
    one step), so exactly one task runs and the other 39 are superseded, each by the
    push that followed it."""
    debounced = tasks.sync_record.push_with(debounce_s=5, debounce_key="race")
    start = threading.Barrier(2)
    pushed: dict[str, list[str]] = {"a": [], "b": []}

    def producer(name: str) -> None:
        start.wait()
        for i in range(20):
            pushed[name].append(debounced.push(f"race-{name}-{i}").task_id)

    threads = [threading.Thread(target=producer, args=(n,)) for n in pushed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = pushed["a"] + pushed["b"]
    waiting = [m.decode() for m in redis_client.zrange(KEYS.schedule, 0, -1)]
    assert len(waiting) == 1 and waiting[0] in (pushed["a"][-1], pushed["b"][-1])
    winner = waiting[0]
    label = result(winner).get(timeout=30)["label"]
    ran = [name for name in (f"race-{n}-{i}" for n in "ab" for i in range(20))
           if runs(redis_client, name)]  # fmt: skip
    assert ran == [label] and len(runs(redis_client, label)) == 1
    by = {task_id: _superseded_by(task_id) for task_id in every if task_id != winner}
    assert len(by) == 39
    # Each superseded task names a later one: following them always ends at the winner.
    for task_id in by:
        seen = task_id
        for _ in range(40):
            seen = by.get(seen, seen)
        assert seen == winner
    _no_debounce_keys(redis_client)


def test_apush_debounces_the_same_way(worker, redis_client):
    async def view():  # type: ignore[no-untyped-def]
        debounced = tasks.record.push_with(debounce_s=2, debounce_key="async")
        first = await debounced.apush("async-first")
        last = await debounced.apush("async-last")
        return first, await last.aget(timeout=30)

    first, done = asyncio.run(view())
    assert done["label"] == "async-last"
    assert _superseded_by(first.task_id) != first.task_id
    assert runs(redis_client, "async-first") == []
    _no_debounce_keys(redis_client)


def test_what_debounce_refuses_and_stores_nothing(redis_client):
    with pytest.raises(ValueError, match="debounce_s= is the task's countdown"):
        tasks.sync_record.push_with(debounce_s=1, countdown=5)
    with pytest.raises(TypeError, match="give debounce_s= too"):
        tasks.sync_record.push_with(debounce_key="k")
    with pytest.raises(ValueError, match="above 0 seconds"):
        tasks.sync_record.push_with(debounce_s=0)
    with pytest.raises(TypeError, match="non-empty str"):
        tasks.sync_record.push_with(debounce_s=1, debounce_key="")
    with pytest.raises(ValueError, match="is idempotent"):
        tasks.charge.push_with(debounce_s=1).push("o1", 5)
    assert redis_client.dbsize() == 0
