"""Flow control (G14, docs/flow-control.md) with real workers on a real Redis: how many
tasks run at once per key, in which order, who gets a freed slot, at what rate, and
what frees a slot (commit, DLQ, cancel); resurrections and zombies are in
tests/chaos/test_limits_kill.py.

Every task of testproject/demo/limit_tasks.py records its start and its end on the
Redis clock; the tests read how many of one key overlapped from those records, not
from the store's own bookkeeping, so a bookkeeping error cannot hide itself.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
import redis

from relier_django.core.model import config
from relier_django.core.model.errors import ConfigError
from relier_django.core.store.connection import sync_client
from testproject.demo import limit_tasks

RUN = "t"


def _records(client: redis.Redis, run: str = RUN) -> list[tuple[str, str, str, int, int]]:
    """(kind, key, label, fence, ms) of every start and end, in the order written."""
    found = []
    for raw in client.lrange(f"demo:lim:{run}", 0, -1):
        kind, key, label, fence, ms, _pid = (raw.decode() if isinstance(raw, bytes) else raw).split(
            ":"
        )
        found.append((kind, key, label, int(fence), int(ms)))
    return found


def _most_at_once(records: list[tuple[str, str, str, int, int]]) -> dict[str, int]:
    """Per key, the most runs that had started and not ended at one instant (an end at
    the instant of another's start is counted first: the slot was freed before)."""
    events = sorted(((ms, 0 if kind == "end" else 1, key) for kind, key, _, _, ms in records))
    running: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    for _, starts, key in events:
        running[key] += 1 if starts else -1
        most[key] = max(most[key], running[key])
    return dict(most)


def _wait_for(client: redis.Redis, ends: int, run: str = RUN, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(1 for r in _records(client, run) if r[0] == "end") >= ends:
            return
        time.sleep(0.05)
    raise AssertionError(f"{ends} runs did not end in {timeout_s} s: {_records(client, run)}")


def _limit_keys(client: redis.Redis) -> list[str]:
    return sorted(k.decode() if isinstance(k, bytes) else k for k in client.keys("rl:lim:*"))


def _no_limit_keys_left(client: redis.Redis, timeout_s: float = 30) -> None:
    """Once the last commits ran (a task records its end just before its commit), no
    rl:lim:* key is left: every slot freed, every line emptied, every rate expired."""
    deadline = time.monotonic() + timeout_s
    while (
        time.monotonic() < deadline
        and _limit_keys(client)
        and any(not k.endswith(":tat") for k in _limit_keys(client))
    ):
        time.sleep(0.05)
    assert [k for k in _limit_keys(client) if not k.endswith(":tat")] == []


def test_per_key_concurrency_holds_across_workers_and_each_key_gets_its_own_slots(
    worker_factory, redis_client
):
    worker_factory(concurrency=4)
    worker_factory(concurrency=4)
    for i in range(8):
        for customer in ("a", "b", "c"):
            limit_tasks.per_key.push(RUN, customer, f"{customer}{i}", 0.15)
    _wait_for(redis_client, 24)
    most = _most_at_once(_records(redis_client))
    assert max(most.values()) <= 2, most
    assert sorted(most) == ["a", "b", "c"]
    assert max(most.values()) == 2  # 8 slots of workers: the keys did run side by side
    _no_limit_keys_left(redis_client)  # nothing left behind (G7)


def test_concurrency_one_per_key_runs_each_key_in_push_order(worker_factory, redis_client):
    worker_factory(concurrency=4)
    for i in range(6):
        for customer in ("a", "b"):
            limit_tasks.sequence.push(RUN, customer, f"{customer}{i}", 0.02)
    _wait_for(redis_client, 12)
    records = _records(redis_client)
    assert max(_most_at_once(records).values()) == 1
    for customer in ("a", "b"):
        started = [
            label for kind, key, label, _, _ in records if kind == "start" and key == customer
        ]
        assert started == [f"{customer}{i}" for i in range(6)]


def test_a_shared_limit_hands_freed_slots_to_the_keys_in_turn(worker_factory, redis_client):
    """10 tasks of tenant 'big' pushed before 1 of tenant 'small': with 2 shared slots,
    'small' runs once one slot frees, not after every one of 'big's."""
    for i in range(10):
        limit_tasks.shared.push(RUN, "big", f"big{i}", 0.1)
    limit_tasks.shared.push(RUN, "small", "small0", 0.1)
    worker_factory(concurrency=4)
    _wait_for(redis_client, 11)
    records = _records(redis_client)
    total = defaultdict(int)
    most = 0
    for _, starts, _key in sorted(
        (ms, 0 if k == "end" else 1, key) for k, key, _, _, ms in records
    ):
        total["all"] += 1 if starts else -1
        most = max(most, total["all"])
    assert most <= 2
    starts = [label for kind, _, label, _, _ in records if kind == "start"]
    assert starts.index("small0") <= 3, starts


def test_a_failed_task_and_a_cancel_free_their_slots_for_the_next(worker_factory, redis_client):
    from relier_django import result

    worker_factory(concurrency=2)
    # One slot per customer: a failure (the DLQ) and a cancel must hand it on.
    blocked = limit_tasks.sequence.push(RUN, "x", "x0", 0.5, "")
    waiting = limit_tasks.sequence.push(RUN, "x", "x1", 0.0, "")
    third = limit_tasks.sequence.push(RUN, "x", "x2", 0.0, "")
    time.sleep(0.2)
    assert result(waiting.task_id).cancel()  # parked: it leaves the line
    _wait_for(redis_client, 2)
    starts = [label for kind, _, label, _, _ in _records(redis_client) if kind == "start"]
    assert starts == ["x0", "x2"]
    assert blocked.get(timeout=30) == "x0" and third.get(timeout=30) == "x2"
    _no_limit_keys_left(redis_client)


def test_a_retry_keeps_its_key_s_slot_so_the_key_stays_in_order(worker_factory, redis_client):
    worker_factory(concurrency=4)
    first = limit_tasks.flaky.push(RUN, "k", "k0")
    second = limit_tasks.sequence.push(RUN, "k", "k1", 0.0)  # another task, another scope
    assert first.get(timeout=30) == "k0"
    assert second.get(timeout=30) == "k1"
    runs = [
        (label, fence) for kind, _, label, fence, _ in _records(redis_client) if kind == "start"
    ]
    assert ("k0", 1) in runs and ("k0", 2) in runs


def test_a_workflow_step_created_by_a_commit_waits_for_its_slot(worker_factory, redis_client):
    """A chain's next step is created by its predecessor's commit (commit.lua), not by a
    push: it goes through its own limit all the same, so it waits while another task of
    its key holds the one slot."""
    from celery import chain

    from relier_django import result

    worker_factory(concurrency=4)
    blocker = limit_tasks.sequence.push(RUN, "w", "blocker", 1.0)
    _wait_for_start(redis_client, "blocker")
    steps = chain(
        limit_tasks.per_key.si(RUN, "z", "head", 0.0),
        limit_tasks.sequence.si(RUN, "w", "step", 0.0),
    ).apply_async()
    assert result(steps.id).get(timeout=30) == "step"
    assert blocker.get(timeout=30) == "blocker"
    records = _records(redis_client)
    assert _most_at_once(records)["w"] == 1, records
    starts = [label for kind, _, label, _, _ in records if kind == "start"]
    assert starts.index("step") > starts.index("blocker")
    _no_limit_keys_left(redis_client)


def _wait_for_start(client: redis.Redis, label: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(r[0] == "start" and r[2] == label for r in _records(client)):
        assert time.monotonic() < deadline, f"{label} did not start in {timeout_s} s"
        time.sleep(0.02)


def test_a_rate_holds_across_workers(worker_factory, redis_client):
    """20/s with a burst of 20: 60 tasks take at least two seconds past the first 20."""
    worker_factory(concurrency=4)
    worker_factory(concurrency=4)
    for i in range(60):
        limit_tasks.rated.push(RUN, f"r{i}")
    _wait_for(redis_client, 60)
    starts = sorted(ms for kind, _, _, _, ms in _records(redis_client) if kind == "start")
    # Dispatched: within any 1 s at most 20 + 20 (a window's burst and its steady
    # flow). These are start times, a worker's pick-up later than the dispatch: a
    # start of the burst delayed by a busy machine shares its second with a few more
    # of the flow, hence 45 (without the rate all 60 would start within a second, and
    # with a rate per worker, as Celery's, so would they: 2 x 40).
    for i, at in enumerate(starts):
        within = sum(1 for other in starts[i:] if other < at + 1000)
        assert within <= 45, (i, within)
    # 40 past the burst, dispatched 50 ms apart: 2 s from the first to the last. A
    # start of the burst picked up late shortens what the starts show; a rate held per
    # worker (two workers, 20/s each) would show half of it.
    assert starts[-1] - starts[0] >= 1500


def test_a_limit_the_settings_do_not_define_is_refused_at_push(redis_client, settings):
    settings.RELIER = {**settings.RELIER, "LIMITS": {}}
    from relier_django import conf

    conf.get_config.cache_clear()
    try:
        with pytest.raises(ConfigError, match="limit='shared' is not in RELIER\\['LIMITS'\\]"):
            limit_tasks.shared.push(RUN, "t", "l0")
    finally:
        conf.get_config.cache_clear()


def test_a_key_that_is_not_a_short_string_is_refused_at_push(redis_client):
    with pytest.raises(ValueError, match="concurrency key"):
        limit_tasks.per_key.push(RUN, "x" * 200, "l0")
    with pytest.raises(ValueError, match="concurrency key"):
        limit_tasks.per_key.push(RUN, {"a": 1}, "l0")  # type: ignore[arg-type]
    assert sync_client(config.current()).zcard("rl:sched") == 0


def test_an_idle_scope_leaves_the_in_use_indexes_once_its_last_holder_frees(
    worker_factory, redis_client
):
    """``lim_scopes`` lists a scope while it holds a slot or parks a task, ``lim_rates``
    a rate scope while its reservation lasts (readers list them from there, never by a
    SCAN): once the tasks are done, neither names any, and neither key is left (G7)."""
    from relier_django.core.store.keys import KeySpace
    from testproject.harness import wait_until

    keys = KeySpace("rl")
    for i in range(3):
        for customer in ("a", "b"):
            limit_tasks.sequence.push(RUN, customer, f"{customer}{i}", 0.05)
    # Pushed before any worker runs: each key's first task holds its slot, the rest park.
    assert redis_client.smembers(keys.limit_scopes) == {
        b"t:demo.lim.sequence|a",
        b"t:demo.lim.sequence|b",
    }
    for i in range(3):
        limit_tasks.rated.push(RUN, f"r{i}")
    worker_factory(concurrency=2)
    # The leader reserves the rate's time at dispatch: the rate scope is listed, with a TTL.
    wait_until(
        lambda: redis_client.zscore(keys.limit_rates, "t:demo.lim.rated") is not None,
        30,
        what="the rate scope in lim_rates",
    )
    assert redis_client.pttl(keys.limit_rates) > 0
    _wait_for(redis_client, 9)
    wait_until(lambda: not redis_client.exists(keys.limit_scopes), 10, what="lim_scopes emptied")
    wait_until(lambda: not redis_client.exists(keys.limit_rates), 10, what="lim_rates expired")
    _no_limit_keys_left(redis_client)


def test_a_released_dlq_entry_waits_for_its_slot(worker_factory, redis_client):
    """Releasing a DLQ entry of a limited task goes through its gate, as a push does:
    while another task of its key holds the one slot, the released task waits parked,
    and runs once that slot frees, never beside it. Its push's own limit
    (``push_with(limit=...)``) came back from the DLQ with its envelope."""
    from relier_django.core.dlq import release
    from relier_django.core.store.keys import KeySpace
    from testproject.celery import app
    from testproject.harness import wait_until

    keys = KeySpace("rl")
    worker_factory(concurrency=4)
    limited = limit_tasks.free_fails.push_with(limit="single", concurrency_key="r")
    failed = limited.push(RUN, "r", "bad")
    wait_until(lambda: redis_client.exists(keys.dlq_entry(failed.task_id)), 30, what="in the DLQ")
    blocker = limit_tasks.free.push_with(limit="single", concurrency_key="r").push(
        RUN, "r", "blocker", 1.0
    )
    _wait_for_start(redis_client, "blocker")
    release.release(app, config.current(), failed.task_id)
    wait_until(
        lambda: redis_client.hget(keys.task(failed.task_id), "state") == b"parked",
        10,
        what="the released task parked behind the blocker",
    )
    assert blocker.get(timeout=30) == "blocker"
    _wait_for(redis_client, 3)  # bad, blocker, bad again (it fails again: the DLQ again)
    records = _records(redis_client)
    assert _most_at_once(records) == {"r": 1}, records
    starts = [label for kind, _, label, _, _ in records if kind == "start"]
    assert starts == ["bad", "blocker", "bad"]
    _no_limit_keys_left(redis_client)


def test_a_release_whose_limit_the_settings_no_longer_define_stays_in_the_dlq(
    redis_client, settings
):
    from relier_django import conf
    from relier_django.core.dlq import dead_letter, release
    from relier_django.core.model.errors import EntryNotReleasable
    from relier_django.core.model.failure import Failure, Reason
    from relier_django.core.push import idempotency, producer
    from relier_django.core.store.keys import KeySpace
    from relier_django.core.worker import fencing
    from testproject.celery import app

    keys, client = KeySpace("rl"), sync_client(config.current())
    spec = limit_tasks.free.relier_spec
    env = producer.prepare(spec, (RUN, "k", "x"), {}, flow=("single", "k"))
    assert idempotency.store(keys, env, env.encode(), 60_000, 3).run(client).stored
    assert fencing.start(keys, env, "w1@host:1", 30_000).run(client).started
    failure = Failure(Reason.EXCEPTION, "ValueError", "boom", worker="w1@host:1")
    assert dead_letter.dead_letter(keys, failure, 60_000, env=env).run(client).accepted
    settings.RELIER = {**settings.RELIER, "LIMITS": {}}
    conf.get_config.cache_clear()
    try:
        with pytest.raises(EntryNotReleasable, match="limit='single' is not in RELIER"):
            release.release(app, config.current(), env.id)
    finally:
        conf.get_config.cache_clear()
    assert redis_client.zscore(keys.dlq, env.id) is not None  # still in the DLQ
    assert not redis_client.exists(keys.task(env.id))
