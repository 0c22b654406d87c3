"""G1 and G13 across partitions: a chain step's (a chord member's) pool process
SIGKILLed right after its commit recorded the hand-over (crash point "after
commit.lua") and before it stored the next step in that step's partition (counted its
result in the chord's): the scanner leader's sweep completes the hand-over
(store/handover.py), and every step, and the chord's callback, still runs exactly once.

A real prefork worker run through the crash-point launcher (relier_django.crashpoints),
on a 4-partition store on the session's private Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import chain, chord

import relier_django
from relier_django.core import crashpoint
from relier_django.core.model import config
from relier_django.core.store.keys import KeySpace
from relier_django.crashpoints import hook
from relier_django.crashpoints.servers import CrashWorker
from testproject.demo import tasks
from testproject.harness import process_pointed_at, worker_env
from tests.chaos.test_resurrection import FAST
from tests.integration.workflows.test_chord import relier_backend  # noqa: F401 (a fixture)
from tests.integration.workflows.test_link import fences, received
from tests.integration.workflows.test_partitioned import PARTITIONED, id_in, no_hand_over_left
from tests.leaks import assert_no_leaked_keys

pytestmark = pytest.mark.chaos


@pytest.fixture
def crash_worker(redis_server, redis_client, tmp_path: Path) -> Iterator[CrashWorker]:
    env = worker_env(redis_server.url, {**PARTITIONED, **FAST})
    with process_pointed_at(PARTITIONED):
        worker = CrashWorker("testproject", tmp_path / "crash", env).start()
        try:
            yield worker
        finally:
            worker.stop()
            # The store's layout record says PARTITIONS=4: a later test that does not
            # flush first (a migrate's system checks) must find the session's Redis as
            # an unpartitioned process left it.
            redis_client.flushall()


def test_a_step_killed_between_its_commit_and_its_hand_over_still_has_its_successor_run_once(
    crash_worker: CrashWorker, redis_client
) -> None:
    keys = KeySpace.of(config.current())
    add = "demo.step_add"
    # The first step's crossings: 0 "before commit.lua", 1 "after commit.lua".
    hook.arm(crash_worker.directory, add, 1)
    ids = [id_in(keys, 0), id_in(keys, 2), id_in(keys, 3)]
    steps = [tasks.step_add.s(1, 1).set(task_id=ids[0]), tasks.step_add.s(10).set(task_id=ids[1]),
             tasks.step_add.s(100).set(task_id=ids[2])]  # fmt: skip
    chain(*steps).apply_async()
    assert relier_django.result(ids[-1]).get(timeout=60) == 112
    trace = hook.read_trace(crash_worker.directory)
    first_pid = trace[0].pid
    killed = [c.boundary for c in trace if c.pid == first_pid]
    assert killed == [crashpoint.BEFORE_COMMIT, crashpoint.AFTER_COMMIT]  # died right there
    assert not hook.disarm(crash_worker.directory)  # the arming fired
    assert [fences(redis_client, i) for i in ids] == [[1]] * 3  # each step once
    # The second step was stored by the sweep, from the dead step's record.
    assert redis_client.get(keys.handed(ids[1])) == ids[0].encode()
    assert no_hand_over_left(redis_client, keys)
    assert_no_leaked_keys(redis_client, keys)


@pytest.mark.usefixtures("relier_backend")
def test_a_chord_member_killed_before_its_hand_over_still_completes_the_header_once(
    crash_worker: CrashWorker, redis_client
) -> None:
    keys = KeySpace.of(config.current())
    # The first member's crossings: 0 "before commit.lua", 1 "after commit.lua".
    hook.arm(crash_worker.directory, "demo.step_add", 1)
    header = [tasks.step_add.s(k, 10).set(task_id=id_in(keys, k)) for k in range(4)]
    result = chord(header)(tasks.step_sum.s(0).set(task_id=id_in(keys, 1)))
    assert result.get(timeout=60) == sum(range(10, 14))
    assert not hook.disarm(crash_worker.directory)  # the arming fired
    trace = hook.read_trace(crash_worker.directory)
    killed = [c.boundary for c in trace if c.pid == trace[0].pid]
    assert killed == [crashpoint.BEFORE_COMMIT, crashpoint.AFTER_COMMIT]  # died right there
    assert received(redis_client, result.id) == [[10, 11, 12, 13]]
    assert fences(redis_client, result.id) == [1]  # the callback once
    assert [fences(redis_client, m.id) for m in header] == [[1]] * 4
    assert no_hand_over_left(redis_client, keys)
    assert_no_leaked_keys(redis_client, keys)
