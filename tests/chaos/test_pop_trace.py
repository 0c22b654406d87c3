"""A pop that leaves a trace (G15): a message a worker takes is marked held by it in the
same step, so a worker SIGKILLed with a take in flight strands nothing.

Before, the worker's main process waited on ``BRPOP`` over its queues: a whole-worker
SIGKILL left that command outstanding, and Redis popped the next message pushed into a
socket the kernel had not closed yet. The task, stored and covered only by its queued
grace, waited an hour (``QUEUED_GRACE_S``). Now the blocking wait pops nothing but a
doorbell (``transport.bell_of``), and the message is taken by ``take.lua``, which marks
its task held by the taker: a taker found dead has its tasks handed off in the same
pass that resurrects its running ones.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.demo import tasks
from testproject.harness import process_pointed_at, wait_until

KEYS = KeySpace("rl")
QUICK_SCAN = {"RELIER_SCAN_INTERVAL_S": "0.5"}
ROUNDS = 4
# Far below QUEUED_GRACE_S (an hour), the bound a stranded message waited for; above a
# worker's start plus one death check and one heartbeat TTL (10 s by default).
BOUND_S = 30.0


def _start_ms(client, task_id: str) -> int | None:  # type: ignore[no-untyped-def]
    started = client.hget(KEYS.task(task_id), "started_ms")
    if started is not None:
        return int(started)
    return int(time.time() * 1000) if client.exists(KEYS.result(task_id)) else None


@pytest.mark.parametrize("broker", ["the store's database", "another database"])
def test_a_push_right_after_a_whole_worker_sigkill_is_taken_by_the_next_worker(
    worker_factory, redis_server, redis_client, broker
):
    """An idle worker is SIGKILLed (main process and pool at once) and a task is pushed
    within a millisecond, while its blocking wait may still be outstanding in Redis;
    the worker started next runs it, every round. Before the fix a push in that instant
    went into the dead socket in most rounds (11 of 12 measured) and waited an hour.
    With the broker on the store's database the take marks the task held (take.lua);
    on another one it keeps a copy in the taker's in-flight record (take_inflight.lua),
    which the scanner puts back when it finds the taker dead."""
    env = dict(QUICK_SCAN)
    if broker == "another database":
        env["CELERY_BROKER_URL"] = redis_server.url.rsplit("/", 1)[0] + "/1"
    with process_pointed_at(env):
        _rounds(worker_factory, env)


def _rounds(worker_factory, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    client = sync_client(config.current())
    late = []
    for n in range(ROUNDS):
        doomed = worker_factory(name=f"doomed{n}", extra_env=env)
        time.sleep(0.3)  # idle: its blocking wait is outstanding
        assert doomed.process is not None
        os.killpg(doomed.process.pid, signal.SIGKILL)
        receipt = tasks.work.push(f"pt-{n}", 0.0)
        doomed.kill()  # reaps it
        pushed = time.monotonic()
        taker = worker_factory(name=f"taker{n}", extra_env=env)
        try:
            wait_until(lambda r=receipt: r.status == "SUCCESS", BOUND_S, what=f"round {n}")
        except TimeoutError:
            late.append((n, receipt.task_id, client.hgetall(KEYS.task(receipt.task_id))))
        else:
            assert client.lrange(f"demo:exec:pt-{n}", 0, -1) in (["1"], ["2"])
        taker.kill()
        assert time.monotonic() - pushed < BOUND_S + 60
    assert not late, f"stranded after a whole-worker SIGKILL: {late}"
