"""resurrect.lua and resurrected.lua take a batch of tasks per call; each task in a
batch gets the answer it would get alone."""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
import redis

from relier_django.core.model import config
from relier_django.core.model.transition import history_tail
from relier_django.core.push import idempotency, producer
from relier_django.core.recovery import resurrector
from relier_django.core.recovery.resurrector import SCRIPT_BATCH, Resurrector
from relier_django.core.store import scripts
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import RedisServer

KEYS = KeySpace("rl")


class RecordingApp:
    """Stands in for Celery's publish only; every Redis step is the real one. Its queues
    and conf are the testproject's, where publish.declare registers the recovery queue."""

    amqp, conf = app.amqp, app.conf

    def __init__(self, refuse: set[str] = frozenset()) -> None:
        self.sent: list[tuple[str, int]] = []
        self.refuse = refuse

    def send_task(self, name, args, task_id, **kwargs):  # type: ignore[no-untyped-def]
        if task_id in self.refuse:
            raise ConnectionError("broker refused this one")
        self.sent.append((task_id, json.loads(args[0])["fence"]))

    def connection_for_write(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("no broker here: the recovery queue counts as empty")


def _stored(client, n: int, max_resurrections: int = 3) -> list[str]:  # type: ignore[no-untyped-def]
    ids = []
    for i in range(n):
        env = producer.prepare(tasks.record.relier_spec, (f"b{i}",), {})
        idempotency.store(KEYS, env, env.encode(), 600_000, max_resurrections).run(client)
        ids.append(env.id)
    return ids


def _expire(client, ids: list[str]) -> None:
    seconds, _ = client.time()
    client.zadd(KEYS.expiry, {i: (int(seconds) - 60) * 1000 for i in ids})


def test_one_pass_over_a_mixed_batch_answers_each_task_as_alone(redis_client):
    client = sync_client(config.current())
    expired, alive, limited = _stored(client, 3), _stored(client, 2), _stored(client, 2, 0)
    _expire(client, expired + limited)
    client.zadd(KEYS.expiry, {"no-such-task": 0})  # a stale index entry
    refused = {expired[0]}
    app = RecordingApp(refuse=refused)

    report = Resurrector(app, config.current(), "batch").run_pass()

    assert report.outcomes == {
        "resurrected": 2,
        "send_failed": 1,
        "dead_lettered": 2,
        "skipped": 1,
    }
    assert sorted(app.sent) == sorted((i, 2) for i in expired[1:])
    for task_id in expired[1:]:  # counted at fence 2, covered by the queued grace
        assert client.hget(KEYS.task(task_id), "res") == "1"
        assert client.hget(KEYS.task(task_id), "fence") == "2"
    # The one the broker refused keeps its lease (fence 2 minted, not counted): a later
    # pass brings it back at fence 3.
    assert client.hget(KEYS.task(expired[0]), "res") == "0"
    assert client.zscore(KEYS.expiry, expired[0]) > client.time()[0] * 1000
    for task_id in alive:  # not expired: untouched
        assert client.hget(KEYS.task(task_id), "fence") == "1"
    for task_id in limited:  # max_resurrections=0: straight to the DLQ
        assert not client.exists(KEYS.task(task_id))
    assert client.zscore(KEYS.expiry, "no-such-task") is None


def test_a_pass_larger_than_one_script_batch_brings_every_task_back_once(redis_client):
    client = sync_client(config.current())
    ids = _stored(client, SCRIPT_BATCH * 2 + 7)
    _expire(client, ids)
    app = RecordingApp()

    report = Resurrector(app, config.current().replace(resurrect_batch=1000), "big").run_pass()

    assert report.outcomes == {"resurrected": len(ids)}
    assert sorted(app.sent) == sorted((i, 2) for i in ids)
    assert {client.hget(KEYS.task(i), "res") for i in ids} == {"1"}


def test_resurrected_tasks_reach_the_real_broker_in_one_producer_batch(redis_client, caplog):
    from testproject.celery import app

    client = sync_client(config.current())
    ids = _stored(client, 150)
    _expire(client, ids)
    cfg = config.current()
    queue = client.lrange(cfg.recovery_queue, 0, -1)
    assert queue == []
    lpush_before = client.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0)

    report = Resurrector(app, cfg.replace(resurrect_batch=1000), "real").run_pass()

    assert report.outcomes == {"resurrected": 150}
    messages = [json.loads(m) for m in client.lrange(cfg.recovery_queue, 0, -1)]
    assert len(messages) == 150
    bodies = [json.loads(base64.b64decode(m["body"]))[0][0] for m in messages]
    assert sorted((json.loads(b)["id"], json.loads(b)["fence"]) for b in bodies) == sorted(
        (i, 2) for i in ids
    )
    assert client.info("commandstats")["cmdstat_lpush"]["calls"] - lpush_before == 150
    assert "publishing one by one" not in caplog.text  # the batch itself went through


def test_a_hash_missing_its_counters_goes_to_the_dlq_and_the_rest_of_the_batch_comes_back(
    redis_client,
):
    client = sync_client(config.current())
    ids = _stored(client, 5)
    client.hdel(KEYS.task(ids[0]), "res", "maxres")  # edited by hand
    client.hset(KEYS.task(ids[1]), "fence", "not-a-number")  # HINCRBY will refuse it
    _expire(client, ids)
    app = RecordingApp()

    report = Resurrector(app, config.current(), "corrupt").run_pass()

    assert report.outcomes == {"dead_lettered": 1, "error": 1, "resurrected": 3}
    assert sorted(app.sent) == sorted((i, 2) for i in ids[2:])
    assert not client.exists(KEYS.task(ids[0]))  # in the DLQ, with its envelope


def test_with_signing_keys_a_resurrection_re_stores_the_envelope_under_the_newest_key(
    redis_client,
):
    from relier_django.core.model.envelope import decode
    from relier_django.core.model.signing import key_id

    old, new = "old-key-" + "o" * 40, "new-key-" + "n" * 40
    client = sync_client(config.current())
    pushed_under_old = config.current().replace(signing_keys=(old,))
    env = producer.prepare(tasks.record.relier_spec, ("rotated",), {})
    encoded = env.encode(pushed_under_old.signer)
    idempotency.store(KEYS, env, encoded, 600_000, 3).run(client)
    _expire(client, [env.id])
    rotating = config.current().replace(signing_keys=(new, old))  # step 2 of a rotation

    report = Resurrector(RecordingApp(), rotating, "rotation").run_pass()

    assert report.outcomes == {"resurrected": 1}
    stored = client.hget(KEYS.task(env.id), "env")
    assert json.loads(stored)["hmac"]["kid"] == key_id(new)
    # Step 3 retires the old key: the stored copy still verifies.
    assert decode(stored, config.current().replace(signing_keys=(new,)).signer).id == env.id


def _lease(client, ids: list[str], lease_ms: int = 30_000) -> list:  # type: ignore[no-untyped-def]
    return scripts.RESURRECT.run(
        client,
        KEYS.for_resurrect(ids),
        [lease_ms, "direct", uuid.uuid4().hex, 10_000, 60_000, *ids],
    )


def _history(client, task_id: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return [json.loads(e) for e in client.lrange(KEYS.history(task_id), 0, -1)]


def test_a_task_whose_step_fails_is_not_leased_and_its_history_untouched(redis_client):
    """G1: the batch writes its leases in one ZADD at the end; a task answered -1 is not
    among them, so its deadline stays past and the next pass retries it."""
    client = sync_client(config.current())
    ids = _stored(client, 3)
    client.hset(KEYS.task(ids[1]), "fence", "7.5")  # HINCRBY would refuse it too
    _expire(client, ids)
    past = client.zscore(KEYS.expiry, ids[1])
    history_before = _history(client, ids[1])

    replies = _lease(client, ids)

    assert [int(r[0]) for r in replies] == [1, -1, 1]
    assert "not an integer" in replies[1][1]
    assert client.zscore(KEYS.expiry, ids[1]) == past
    assert client.hmget(KEYS.task(ids[1]), "fence", "state") == ["7.5", "queued"]
    assert _history(client, ids[1]) == history_before
    now_ms = client.time()[0] * 1000
    for task_id in (ids[0], ids[2]):
        assert client.zscore(KEYS.expiry, task_id) > now_ms
        assert client.hmget(KEYS.task(task_id), "fence", "state", "worker") == ["2", "queued", ""]
        assert _history(client, task_id)[-1]["event"] == "expired"


def test_a_task_id_given_twice_in_one_batch_is_leased_once(redis_client):
    """G2: one fence minted per lease, as if each id had its own call."""
    client = sync_client(config.current())
    [task_id] = _stored(client, 1)
    _expire(client, [task_id])

    replies = _lease(client, [task_id, task_id])

    assert [r[:2] for r in replies] == [[1, 2], [0, "alive"]]
    assert client.hget(KEYS.task(task_id), "fence") == "2"
    assert [e["event"] for e in _history(client, task_id)].count("expired") == 1


def test_a_server_without_zmscore_reads_the_deadlines_one_by_one(tmp_path):
    """Redis before 6.2 has no ZMSCORE: the same answers, from one ZSCORE per task."""
    server = RedisServer(tmp_path, extra_args=("--rename-command", "ZMSCORE", "")).start()
    try:
        client = server.client(decode_responses=True)
        ids = _stored(client, 3)
        _expire(client, ids[:2])
        client.zadd(KEYS.expiry, {"no-such-task": 0})

        replies = _lease(client, [*ids, "no-such-task"])

        assert [r[:2] for r in replies] == [[1, 2], [1, 2], [0, "alive"], [0, "gone"]]
        assert "cmdstat_zmscore" not in client.info("commandstats")
        client.close()
    finally:
        server.stop()


def test_resurrected_records_each_task_before_a_failing_one_whole(redis_client):
    """G1: the queued graces are written in one ZADD after the batch, also when a task
    fails the call: those recorded before it keep their grace, as with a call each."""
    client = sync_client(config.current())
    ids = _stored(client, 3)
    _expire(client, ids)
    _lease(client, ids)
    client.hset(KEYS.task(ids[1]), "res", "one")  # HINCRBY would refuse it too
    leased_until = client.zscore(KEYS.expiry, ids[2])
    args: list[object] = [1_000]
    for task_id in ids:
        args += (task_id, 2, "", history_tail("resurrected", fence=2, scanner="direct"))

    with pytest.raises(redis.exceptions.ResponseError, match="not an integer"):
        scripts.RESURRECTED.run(client, KEYS.for_resurrected(ids), args)

    seconds, micros = client.time()
    assert client.hget(KEYS.task(ids[0]), "res") == "1"
    # The grace (1 s), not the lease (30 s):
    assert client.zscore(KEYS.expiry, ids[0]) <= seconds * 1000 + micros // 1000 + 1_000
    assert _history(client, ids[0])[-1]["event"] == "resurrected"
    for task_id in ids[1:]:  # nothing written for the failing task nor those after it
        assert _history(client, task_id)[-1]["event"] == "expired"
    assert client.hget(KEYS.task(ids[1]), "res") == "one"
    assert client.hget(KEYS.task(ids[2]), "res") == "0"
    assert client.zscore(KEYS.expiry, ids[2]) == leased_until


def test_resurrected_counts_and_re_stores_in_one_write_per_task(redis_client):
    """The count and (signed) envelope go in one HSET; a moved fence writes nothing."""
    client = sync_client(config.current())
    ids = _stored(client, 2)
    _expire(client, ids)
    _lease(client, ids)
    client.hset(KEYS.task(ids[1]), "fence", "3")  # superseded meanwhile
    args: list[object] = [60_000]
    for task_id in ids:
        args += (task_id, 2, '{"new":1}', history_tail("resurrected", fence=2, scanner="d"))
    before = client.info("commandstats")

    recorded = scripts.RESURRECTED.run(client, KEYS.for_resurrected(ids), args)

    after = client.info("commandstats")
    assert [int(r) for r in recorded] == [1, 0]
    assert client.hmget(KEYS.task(ids[0]), "res", "env") == ["1", '{"new":1}']
    assert client.hget(KEYS.task(ids[1]), "res") == "0"
    assert after["cmdstat_hset"]["calls"] - before["cmdstat_hset"]["calls"] == 1
    assert after["cmdstat_zadd"]["calls"] - before["cmdstat_zadd"]["calls"] == 1
    assert client.zscore(KEYS.expiry, ids[0]) > client.time()[0] * 1000 + 30_000


def test_a_window_of_script_batches_is_leased_before_any_of_it_is_published(
    redis_client, monkeypatch
):
    """G1: every task of a window holds its lease (fence 2 minted) before the first
    publish, and the next window is leased only after this one was published."""
    monkeypatch.setattr(resurrector, "SCRIPT_BATCH", 2)
    monkeypatch.setattr(resurrector, "LEASE_AHEAD", 2)
    client = sync_client(config.current())
    ids = sorted(_stored(client, 7))  # one score: the index returns them by id
    _expire(client, ids)
    leased_at_send: list[set[str]] = []

    class Watching(RecordingApp):
        def send_task(self, name, args, task_id, **kwargs):  # type: ignore[no-untyped-def]
            leased_at_send.append({i for i in ids if client.hget(KEYS.task(i), "fence") == "2"})
            super().send_task(name, args, task_id, **kwargs)

    app = Watching()
    report = Resurrector(app, config.current(), "window").run_pass()

    assert report.outcomes == {"resurrected": 7}
    assert leased_at_send[0] == set(ids[:4])
    assert leased_at_send[4] == set(ids)
    assert {client.hget(KEYS.task(i), "res") for i in ids} == {"1"}


def test_a_batch_whose_recording_fails_stays_covered_by_its_leases(redis_client):
    """G1: published but not recorded, a task keeps its lease; a later pass brings it
    back (with a newer fence, so the copy already published is refused as stale)."""
    client = sync_client(config.current())
    ids = sorted(_stored(client, 3))
    client.hset(KEYS.task(ids[1]), "res", "one")  # resurrect.lua reads it as 0
    _expire(client, ids)
    app = RecordingApp()

    report = Resurrector(app, config.current(), "record-fails").run_pass()

    assert report.outcomes == {"error": 3}
    assert sorted(app.sent) == [(i, 2) for i in ids]
    assert client.hget(KEYS.task(ids[0]), "res") == "1"  # recorded before the failure
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    for task_id in ids[1:]:  # not recorded: leased for resurrect_lease_s (30 s)
        assert client.hget(KEYS.task(task_id), "fence") == "2"
        assert now_ms < client.zscore(KEYS.expiry, task_id) <= now_ms + 30_000


class MovingApp(RecordingApp):
    """Publishes, and meanwhile a release (say) moves one task's fence on."""

    def __init__(self, client, moved: str) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.client, self.moved = client, moved

    def send_task(self, name, args, task_id, **kwargs):  # type: ignore[no-untyped-def]
        super().send_task(name, args, task_id, **kwargs)
        if task_id == self.moved:
            self.client.hincrby(KEYS.task(task_id), "fence", 1)


def test_a_task_whose_fence_moved_before_the_record_is_counted_superseded(redis_client):
    client = sync_client(config.current())
    ids = _stored(client, 3)
    _expire(client, ids)
    app = MovingApp(client, ids[1])

    report = Resurrector(app, config.current(), "moving").run_pass()

    assert report.outcomes == {"resurrected": 2, "superseded": 1}
    assert client.hget(KEYS.task(ids[1]), "res") == "0"  # not counted as resurrected
    assert client.hget(KEYS.task(ids[0]), "res") == "1"


def test_a_deadline_is_newly_due_once_and_a_stale_one_never(redis_client):
    client = sync_client(config.current())
    res = Resurrector(RecordingApp(), config.current(), "scanner-1")
    stale, fresh = _stored(client, 1), _stored(client, 1)
    _expire(client, stale)  # a minute overdue: a pass already left it (a full queue)
    due, seen = res.newly_due(None)
    assert not due  # a first look has no "since": it only starts the watch
    assert not res.newly_due(seen)[0]  # stale: not new
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    client.zadd(KEYS.expiry, {fresh[0]: now_ms})  # handoff.lua dates a hand-off now
    due, seen = res.newly_due(seen)
    assert due
    # A deadline in the very millisecond of a look may count for one more look; after
    # that it is old news, whatever a pass did with it.
    time.sleep(0.005)
    _, seen = res.newly_due(seen)
    time.sleep(0.005)
    assert not res.newly_due(seen)[0]
