"""Chains and chords under real deaths (docs/workflows.md): a step's pool process SIGKILLed mid-step
is resurrected like any task and the chain goes on from it, each step committing once;
a whole worker SIGKILLed mid-chain loses no step. Real prefork workers, real SIGKILLs."""

from __future__ import annotations

import json

from celery import chain, chord

import relier_django
from relier_django.core.model import config
from relier_django.core.store.connection import sync_client
from testproject.celery import app
from testproject.demo import tasks
from tests.chaos.test_resurrection import FAST, running_pid
from tests.leaks import assert_no_leaked_keys


def steps(last) -> list[str]:
    ids, node = [], last
    while node is not None:
        ids.append(node.id)
        node = node.parent
    return ids[::-1]


def fences(client, task_id: str) -> list[int]:
    return [int(e.split(b":")[0]) for e in client.lrange(f"demo:exec:step:{task_id}", 0, -1)]


def test_a_step_killed_mid_run_is_resurrected_and_the_chain_goes_on_once(
    worker_factory, redis_client
):
    worker = worker_factory(extra_env=FAST)
    client = sync_client(config.current())
    add = tasks.step_add
    last = chain(add.s(1, 2), add.s(3, sleep_s=3.0), add.s(4), add.s(5)).apply_async()
    ids = steps(last)
    worker.kill_child(running_pid(client, ids[1]))  # the second step, mid-run

    assert relier_django.result(last.id).get(timeout=60) == 15
    # The killed step ran again at fence 2; every other step once, at fence 1.
    assert [fences(redis_client, i) for i in ids] == [[1], [1, 2], [1], [1]]
    inputs = [[json.loads(x) for x in redis_client.lrange(f"demo:step-x:{i}", 0, -1)] for i in ids]
    assert inputs == [[1], [3, 3], [6], [10]]
    assert_no_leaked_keys(redis_client)


# A message the doomed worker popped and had not yet registered when the SIGKILL came
# is in neither the queue nor the store's reservations (the known window of
# docs/operations.md#recovery-time); only the queued grace brings it back. Killing
# within milliseconds of the pushes hits that window about one run in three, so the
# grace here is short (the producer's, which dates the task, and the workers'): it
# stays above the few seconds any step waits in this test.
GRACE_S = "8"


def test_a_whole_worker_killed_mid_chain_loses_no_step(worker_factory, redis_client, settings):
    settings.RELIER = {**settings.RELIER, "QUEUED_GRACE_S": float(GRACE_S)}
    env = {**FAST, "RELIER_QUEUED_GRACE_S": GRACE_S}
    doomed = worker_factory(name="doomed", extra_env=env)
    worker_factory(name="survivor", extra_env=env)
    client = sync_client(config.current())
    add = tasks.step_add
    chains = [chain(add.s(i, 1, sleep_s=0.5), add.s(1, sleep_s=0.5), add.s(1)).apply_async()
              for i in range(6)]  # fmt: skip
    running_pid(client, steps(chains[0])[0])
    doomed.kill()  # SIGKILL: the main process and its pool, mid-chain

    assert [relier_django.result(c.id).get(timeout=90) for c in chains] == [i + 3 for i in range(6)]
    for c in chains:
        for task_id in steps(c):
            runs = fences(redis_client, task_id)
            # Once, or again at a higher fence when the kill took the run (or only at
            # fence 2: a prefetched step that the kill took before it started).
            assert runs and runs == sorted(set(runs)), (task_id, runs)
    assert_no_leaked_keys(redis_client)


def test_a_chord_member_killed_mid_run_still_fires_the_callback_once(worker_factory, redis_client):
    from tests.integration.workflows.test_chord import BACKEND  # relier's backend starts chords

    before = app.conf.result_backend
    app.conf.result_backend, app._backend_cache = BACKEND, None
    vars(app._local).pop("backend", None)
    try:
        worker = worker_factory(extra_env=FAST)
        client = sync_client(config.current())
        header = [tasks.step_add.s(i, 1, sleep_s=2.0 if i == 3 else 0.0) for i in range(8)]
        result = chord(header)(tasks.step_sum.s(0))
        victim = result.parent.results[3].id
        worker.kill_child(running_pid(client, victim))

        assert relier_django.result(result.id).get(timeout=60) == sum(range(1, 9))
        assert fences(redis_client, victim) == [1, 2]  # resurrected, committed once
        assert fences(redis_client, result.id) == [1]  # the callback ran once
        callback_got = json.loads(redis_client.lrange(f"demo:step-x:{result.id}", 0, -1)[0])
        assert callback_got == list(range(1, 9))  # the complete header, in order
    finally:
        app.conf.result_backend, app._backend_cache = before, None
        vars(app._local).pop("backend", None)


def test_a_chain_inside_a_chord_killed_mid_step_fills_its_place_once(worker_factory, redis_client):
    from tests.integration.workflows.test_chord import BACKEND  # relier's backend starts chords

    before = app.conf.result_backend
    app.conf.result_backend, app._backend_cache = BACKEND, None
    vars(app._local).pop("backend", None)
    try:
        worker = worker_factory(extra_env=FAST)
        client = sync_client(config.current())
        add = tasks.step_add
        header = [
            add.s(100, 0),
            chain(add.s(1, 1), add.s(10, sleep_s=3.0), add.s(100)),  # 2, 12, 112
            chain(add.s(0, 5), add.s(5)),  # 5, 10
        ]
        result = chord(header)(tasks.step_sum.s(0))
        ids = steps(result.parent.results[1])
        worker.kill_child(running_pid(client, ids[1]))  # the chain's middle step, mid-run

        assert relier_django.result(result.id).get(timeout=60) == 100 + 112 + 10
        # The killed step ran again at fence 2 and committed once; its chain went on.
        assert [fences(redis_client, i) for i in ids] == [[1], [1, 2], [1]]
        assert fences(redis_client, result.id) == [1]  # the callback ran once
        callback_got = json.loads(redis_client.lrange(f"demo:step-x:{result.id}", 0, -1)[0])
        assert callback_got == [100, 112, 10]  # the chain's last result in its place
        assert_no_leaked_keys(redis_client)
    finally:
        app.conf.result_backend, app._backend_cache = before, None
        vars(app._local).pop("backend", None)


def test_a_chord_member_inside_a_chain_killed_mid_run_lets_the_chain_go_on_once(
    worker_factory, redis_client
):
    import uuid

    from celery import group

    from tests.integration.workflows.test_chord import BACKEND  # relier's backend starts chords

    before = app.conf.result_backend
    app.conf.result_backend, app._backend_cache = BACKEND, None
    vars(app._local).pop("backend", None)
    try:
        worker = worker_factory(extra_env=FAST)
        client = sync_client(config.current())
        add = tasks.step_add
        victim = f"member-{uuid.uuid4().hex[:8]}"
        header = group(add.s(10, sleep_s=3.0).set(task_id=victim), add.s(20), add.s(30))
        last = chain(add.s(1, 1), header, tasks.step_sum.s(0), add.s(1)).apply_async()
        worker.kill_child(running_pid(client, victim))  # a header member, mid-run

        assert relier_django.result(last.id).get(timeout=60) == 12 + 22 + 32 + 1
        assert fences(redis_client, victim) == [1, 2]  # resurrected, committed once
        assert fences(redis_client, last.id) == [1]
        callback = steps(last)[-2]
        assert fences(redis_client, callback) == [1]  # the chord's callback ran once
        got = json.loads(redis_client.lrange(f"demo:step-x:{callback}", 0, -1)[0])
        assert got == [12, 22, 32]  # every member's result, in header order
        assert_no_leaked_keys(redis_client)
    finally:
        app.conf.result_backend, app._backend_cache = before, None
        vars(app._local).pop("backend", None)
