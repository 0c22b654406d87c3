"""Debounce (issue 38) through deaths: the last push of a burst runs exactly once
whichever process dies around the end of its window. The waiting task is in Redis (the
schedule index), not in a worker, so a dead scanner leader only delays it; once it is
dispatched it is an ordinary task, resurrected fenced if its worker dies. Real prefork
workers, SIGKILLed whole."""

from __future__ import annotations

import time

import pytest

from relier_django import TaskSuperseded, result
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import wait_until

from ..leaks import assert_no_leaked_keys

KEYS = KeySpace("rl")
QUICK = {"RELIER_SCAN_INTERVAL_S": "0.5"}


def _runs(client, label: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.decode() for r in client.lrange(f"demo:exec:{label}", 0, -1)]


def _burst(key: str, sleep_s: float = 0.0) -> list[str]:
    debounced = tasks.sync_record.push_with(debounce_s=3, debounce_key=key)
    return [debounced.push(f"{key}-{i}", sleep_s=sleep_s).task_id for i in range(4)]


def _only_the_last_ran(client, key: str, pushed: list[str]) -> None:  # type: ignore[no-untyped-def]
    last = pushed[-1]
    assert result(last).get(timeout=90)["label"] == f"{key}-3"
    assert len(_runs(client, f"{key}-3")) == 1
    for i, task_id in enumerate(pushed[:-1]):
        assert _runs(client, f"{key}-{i}") == []
        with pytest.raises(TaskSuperseded):
            result(task_id).get(timeout=5)
    wait_until(lambda: not list(client.scan_iter("rl:db:*")), 10, what="debounce records gone")
    assert_no_leaked_keys(client)


def test_the_scanner_leader_killed_before_the_window_ends_still_runs_the_last_once(
    worker_factory, redis_client
):
    """The only worker (its scanner the leader) is SIGKILLed inside the window; the
    window ends with no worker at all; a new worker runs the last push, once."""
    doomed = worker_factory(name="doomed", extra_env=QUICK)
    pushed = _burst("leader")
    doomed.kill()
    time.sleep(3.5)  # the window is over, and nothing is up to dispatch it
    assert [m.decode() for m in redis_client.zrange(KEYS.schedule, 0, -1)] == [pushed[-1]]
    worker_factory(name="second", extra_env=QUICK)
    _only_the_last_ran(redis_client, "leader", pushed)


def test_the_worker_running_the_last_push_killed_runs_it_again_once(worker_factory, redis_client):
    """The last push is dispatched at the window's end and its worker is SIGKILLed
    while running it: a new worker's scanner resurrects it and it runs to one commit;
    the pushes it superseded stay superseded."""
    doomed = worker_factory(name="doomed", extra_env=QUICK)
    pushed = _burst("running", sleep_s=3)
    last = pushed[-1]
    wait_until(
        lambda: redis_client.hget(KEYS.task(last), "state") == b"running",
        30,
        what="the last push running",
    )
    doomed.kill()
    worker_factory(name="survivor", extra_env=QUICK)
    _only_the_last_ran(redis_client, "running", pushed)
