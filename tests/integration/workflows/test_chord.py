"""Chords with relier's guarantees (docs/workflows.md): Celery's ``chord(header)(body)``
over ``@rl_task`` signatures, with relier's result backend (Celery asks a backend to
start a chord). Each member's commit records its result in the chord's state under its
index, once; the commit that completes the header creates the callback in the same
script, exactly once; the callback gets the header's results, in header order."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from celery import chain, chord

import relier_django
from relier_django import dlq
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import wait_until
from tests.leaks import assert_no_leaked_keys

KEYS = KeySpace("rl")
BACKEND = "relier_django.results:RelierBackend"


@pytest.fixture
def relier_backend() -> Iterator[None]:
    """This process's Celery app with relier's result backend (no fallback needed: an
    @rl_task chord is relier's own)."""
    before = app.conf.result_backend

    def use(name):
        app.conf.result_backend = name
        app._backend_cache = None  # Celery keeps the backend built: drop it
        vars(app._local).pop("backend", None)

    use(BACKEND)
    try:
        yield
    finally:
        use(before)


def received(client, task_id: str) -> list:
    return [json.loads(x) for x in client.lrange(f"demo:step-x:{task_id}", 0, -1)]


def runs(client, task_id: str) -> int:
    return int(client.llen(f"demo:exec:step:{task_id}"))


def test_a_chord_runs_its_callback_once_with_every_header_result_in_order(
    relier_backend, worker, redis_client
):
    header = [tasks.step_add.s(i, 10, sleep_s=0.05 * (5 - i)) for i in range(5)]
    result = chord(header)(tasks.step_sum.s(1000))
    assert relier_django.result(result.id).get(timeout=30) == 1000 + sum(range(10, 15))
    # The header's results in header order, whatever order the members finished in.
    assert received(redis_client, result.id) == [[10, 11, 12, 13, 14]]
    assert runs(redis_client, result.id) == 1
    assert_no_leaked_keys(redis_client)
    state = KEYS.chord(result.parent.id)  # dropped just after the callback's commit
    wait_until(lambda: not redis_client.exists(state), 10, what="the chord's state dropped")


def test_the_callback_exists_only_once_the_header_is_complete(relier_backend, redis_client):
    # No worker: the members are stored and queued; the callback does not exist yet.
    result = chord([tasks.step_add.s(1, 1), tasks.step_add.s(2, 2)])(tasks.step_sum.s(0))
    assert not redis_client.exists(KEYS.task(result.id))
    assert redis_client.hget(KEYS.chord(result.parent.id), "size") == b"2"


def test_a_dead_lettered_member_holds_the_callback_until_it_is_released(
    relier_backend, worker, redis_client
):
    redis_client.set("demo:broken:7", 1)
    header = [tasks.step_add.s(1, 1), tasks.step_add.s(1, 7), tasks.step_add.s(1, 2)]
    result = chord(header)(tasks.step_sum.s(0))
    broken = result.parent.results[1].id
    entry = wait_until(lambda: dlq.store().get(broken), 30, what="the broken member in the DLQ")
    assert entry.envelope["chord"]["id"] == result.parent.id
    assert not redis_client.exists(KEYS.task(result.id))  # the callback waits
    redis_client.delete("demo:broken:7")
    dlq.release_entry(broken)
    assert relier_django.result(result.id).get(timeout=30) == 2 + 8 + 3
    assert runs(redis_client, result.id) == 1


def chain_ids(node) -> list[str]:
    ids = []
    while node is not None:
        ids.append(node.id)
        node = node.parent
    return ids[::-1]


def test_a_chain_inside_a_chords_header_fills_its_place_with_its_last_steps_result(
    relier_backend, worker, redis_client
):
    add = tasks.step_add
    header = [
        chain(add.s(1, 1, sleep_s=0.3), add.s(1, sleep_s=0.3), add.s(10)),  # 2, 3, 13
        add.s(5, 5),  # 10, first to finish
        chain(add.s(0, 7), add.s(0)),  # 7, 7
    ]
    result = chord(header)(tasks.step_sum.s(100))
    assert relier_django.result(result.id).get(timeout=30) == 100 + 13 + 10 + 7
    # The chain's result in its place, whatever order the members finished in.
    assert received(redis_client, result.id) == [[13, 10, 7]]
    assert runs(redis_client, result.id) == 1
    members = result.parent.results
    first_chain = chain_ids(members[0])
    assert len(first_chain) == 3 and all(runs(redis_client, i) == 1 for i in first_chain)
    view = relier_django.workflow(result.parent.id)
    assert view is not None and view.state == "SUCCESS"
    # Each chain's steps at its place in the header, in order; the callback last.
    listed = [*first_chain, members[1].id, *chain_ids(members[2]), result.id]
    assert [s.task_id for s in view.steps] == listed
    assert [s.position for s in view.steps] == [0, 0, 0, 1, 2, 2, None]
    assert_no_leaked_keys(redis_client)
    state = KEYS.chord(result.parent.id)  # dropped just after the callback's commit
    wait_until(lambda: not redis_client.exists(state), 10, what="the chord's state dropped")


def test_a_chains_earlier_step_does_not_count_for_the_chord(relier_backend, redis_client):
    # No worker: only the chain's first step exists; it carries the chord's place for
    # its last step, and committing it counts nothing.
    result = chord([chain(tasks.step_add.s(1, 1), tasks.step_add.s(1))])(tasks.step_sum.s(0))
    first, last = chain_ids(result.parent.results[0])
    stored = json.loads(redis_client.hget(KEYS.task(first), "env"))
    assert stored["chord"]["id"] == result.parent.id and stored["chain"][0]["id"] == last
    assert redis_client.hget(KEYS.chord(result.parent.id), "size") == b"1"
    assert not redis_client.hexists(KEYS.chord(result.parent.id), "r:0")
    view = relier_django.workflow(result.parent.id)
    assert view is not None and view.state == "PENDING"
    assert [s.task_id for s in view.steps] == [first, last, result.id]


def test_a_failing_step_of_a_chain_in_a_header_holds_the_callback_until_released(
    relier_backend, worker, redis_client
):
    redis_client.set("demo:broken:7", 1)
    header = [chain(tasks.step_add.s(1, 7), tasks.step_add.s(1)), tasks.step_add.s(2, 2)]
    result = chord(header)(tasks.step_sum.s(0))
    broken = chain_ids(result.parent.results[0])[0]
    entry = wait_until(lambda: dlq.store().get(broken), 30, what="the broken step in the DLQ")
    assert entry.envelope["chord"]["id"] == result.parent.id
    assert not redis_client.exists(KEYS.task(result.id))  # the callback waits
    assert relier_django.workflow(result.parent.id).state == "FAILURE"  # its step is seen
    redis_client.delete("demo:broken:7")
    dlq.release_entry(broken)
    assert relier_django.result(result.id).get(timeout=30) == (8 + 1) + 4
    assert runs(redis_client, result.id) == 1


def test_a_chord_is_readable_under_its_group_id_with_its_callback(
    relier_backend, worker, redis_client
):
    result = chord([tasks.step_add.s(i, 1) for i in range(3)])(tasks.step_sum.s(0))
    relier_django.result(result.id).get(timeout=30)
    view = relier_django.workflow(result.parent.id)
    assert view is not None and view.kind == "chord" and view.state == "SUCCESS"
    assert [s.position for s in view.steps] == [0, 1, 2, None]  # None: the callback
    assert view.steps[-1].task_id == result.id


def test_celery_always_eager_runs_the_whole_chord_here_and_relier_eager_refuses_it(
    relier_backend, settings, redis_client
):
    header = [tasks.step_add.s(i, 1) for i in range(3)]
    app.conf.task_always_eager = True
    try:
        result = chord(header)(tasks.step_sum.s(100))
        assert result.get() == 106  # Celery's own eager chord: every task's apply()
    finally:
        app.conf.task_always_eager = False
    settings.RELIER = {**settings.RELIER, "EAGER": True}
    with pytest.raises(TypeError, match="CELERY_TASK_ALWAYS_EAGER"):
        chord(header)(tasks.step_sum.s(100))


def test_of_members_committing_at_once_exactly_one_creates_the_callback(redis_client):
    # The race commit.lua closes: 12 members, started, commit at the same instant from
    # 12 threads; each records its result once and exactly one creates the callback.
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from relier_django.core.model import config, outcome
    from relier_django.core.model.envelope import Envelope
    from relier_django.core.push import producer
    from relier_django.core.store import chords
    from relier_django.core.store.connection import sync_client
    from relier_django.core.worker import fencing

    cfg, spec, n = config.current(), tasks.step_add.relier_spec, 12
    client, keys = sync_client(cfg), KeySpace.of(cfg)
    members = []
    for i in range(n):
        env = producer.prepare(spec, (i, 1), {}, f"member-{i}")
        producer._Push(cfg, spec, env, env.encode(cfg.signer), keys).store(None).run(client)
        assert fencing.start(keys, env, "w1@host:1", 30_000).run(client).started
        members.append(env)
    chords.set_size(client, keys, "group", n)
    callback = Envelope(id="the-callback", task="demo.step_sum", created_ms=1, header="group")
    barrier = Barrier(n)

    def commit(i: int):
        record = outcome.succeeded(i * 10, members[i].fence)
        successor = fencing.Successor(
            callback, callback.encode(), None, 60_000, 3, "group", i, outcome.result_json(record)
        )
        call = fencing.commit(keys, members[i], record, 60_000, successor=successor)
        barrier.wait()
        return call.run(client)

    with ThreadPoolExecutor(n) as pool:
        done = list(pool.map(commit, range(n)))
    assert all(d.accepted for d in done)
    assert sum(d.value for d in done) == 1  # one commit created the callback
    assert redis_client.hget(keys.task("the-callback"), "state") == b"queued"
    assert redis_client.zscore(keys.of_task("the-callback").expiry, "the-callback") is not None
    assert chords.header_results(client, keys, "group") == [i * 10 for i in range(n)]


def test_an_idempotent_member_whose_key_is_claimed_still_fills_its_place_in_the_header(
    relier_backend, worker, redis_client
):
    """Deduplicated, a member recorded nothing in the chord's state and the callback was
    never created (issue 35): by an earlier member of the same header, or by a push
    made before. A member claims no key: each runs under its frozen id."""
    once = tasks.step_once
    assert once.push(1, 10).get(timeout=30) == 11  # the key (1, 10) is claimed, cached
    result = chord([once.s(1, 10), once.s(1, 10), once.s(2, 10)])(tasks.step_sum.s(0))
    assert relier_django.result(result.id).get(timeout=30) == 11 + 11 + 12
    assert received(redis_client, result.id) == [[11, 11, 12]]
    assert redis_client.llen("demo:once:1:10") == 3


def test_a_cancelled_member_holds_the_callback_in_the_dlq_until_released(
    relier_backend, worker, redis_client
):
    """Cancelled before it started, a member was removed and the chord ended without a
    trace (issue 35). It is filed in the DLQ, reason cancelled, holding the callback;
    released, it completes the header and the callback runs once."""
    header = [tasks.step_add.s(1, 10), tasks.step_add.s(2, 10).set(countdown=60)]
    result = chord(header)(tasks.step_sum.s(0))
    late = result.parent.results[1].id
    assert relier_django.cancel(late) is relier_django.Cancelled.BEFORE_START
    entry = dlq.store().get(late)
    assert entry is not None and entry.reason == "cancelled"
    wait_until(lambda: runs(redis_client, result.parent.results[0].id) == 1, 30)
    assert redis_client.exists(KEYS.task(result.id)) == 0  # the callback waits
    dlq.release_entry(late)
    assert relier_django.result(result.id).get(timeout=30) == 11 + 12
    assert runs(redis_client, result.id) == 1


def _weeks_pass(client, key: str) -> None:  # type: ignore[no-untyped-def]
    """As KEEP_MS (7 days) running out would: a key with any TTL is gone."""
    if client.pttl(key) > 0:
        client.delete(key)


def test_a_member_released_weeks_later_still_completes_the_header_once(
    relier_backend, worker, redis_client
):
    """The chord's state expired 7 days after its last write, so a member released later
    committed and the callback was never created (issue 35). Once every member is
    stored, the state has no TTL: it lives until the callback commits."""
    redis_client.set("demo:broken:8", 1)
    header = [tasks.step_add.s(1, 1), tasks.step_add.s(1, 8)]
    result = chord(header)(tasks.step_sum.s(0))
    broken = result.parent.results[1].id
    wait_until(lambda: dlq.store().get(broken), 30, what="the broken member in the DLQ")
    state = KEYS.chord(result.parent.id)
    assert redis_client.pttl(state) == -1  # sealed: no TTL
    _weeks_pass(redis_client, state)
    redis_client.delete("demo:broken:8")
    dlq.release_entry(broken)
    assert relier_django.result(result.id).get(timeout=30) == 2 + 9
    # Dropped by the callback's worker just after its commit (runner._after_commit):
    # the result can be read a moment before.
    wait_until(lambda: not redis_client.exists(state), 10, what="the chord's state dropped")


def test_deleting_a_members_entry_gives_its_chords_state_a_ttl_back(
    relier_backend, worker, redis_client
):
    """The chord can no longer complete: its sealed state would otherwise stay for ever
    (G7); it goes KEEP_MS after the delete, as an abandoned header's always did."""
    redis_client.set("demo:broken:9", 1)
    result = chord([tasks.step_add.s(1, 1), tasks.step_add.s(1, 9)])(tasks.step_sum.s(0))
    broken = result.parent.results[1].id
    wait_until(lambda: dlq.store().get(broken), 30, what="the broken member in the DLQ")
    state = KEYS.chord(result.parent.id)
    wait_until(lambda: redis_client.hlen(state) >= 2, 30, what="the other member's result")
    assert redis_client.pttl(state) == -1
    assert dlq.store().delete([broken]) == [broken]
    assert 0 < redis_client.pttl(state) <= 7 * 24 * 3600 * 1000


def test_a_chord_callbacks_frozen_id_breaking_the_id_rule_is_refused_at_push(
    relier_backend, redis_client
):
    header = [tasks.step_add.s(i, 10) for i in range(3)]
    with pytest.raises(relier_django.InvalidTaskId, match=r"'total\\n1'.*1 to 64 printable"):
        chord(header)(tasks.step_sum.s(1000).set(task_id="total\n1"))
    assert redis_client.dbsize() == 0  # not even the first member: the callback rides on each


def test_a_chord_with_chains_in_its_header_applied_while_celerys_pool_is_empty_does_not_deadlock(
    relier_backend, worker, redis_client
):
    """Celery's group applies a chain member holding one producer of Celery's pool, and
    the chain applies its first task without it: relier's send takes its producer from
    a pool of its own, so a chord applied while Celery's pool has none left completes."""
    import threading

    pool = app.producer_pool
    taken = [pool.acquire(block=True) for _ in range(pool.limit - 1)]  # one left: the group's
    done, results = threading.Event(), []

    def apply() -> None:
        add = tasks.step_add
        header = [chain(add.s(1, 1), add.s(1)), chain(add.s(2, 2), add.s(2))]
        results.append(chord(header)(tasks.step_sum.s(0)))
        done.set()

    applying = threading.Thread(target=apply, daemon=True)
    try:
        applying.start()
        finished = done.wait(20)
    finally:
        for producer in taken:
            producer.release()
        applying.join(30)
    assert finished, "the chord's apply waited for a second producer from an empty pool"
    assert relier_django.result(results[0].id).get(timeout=30) == 3 + 6
