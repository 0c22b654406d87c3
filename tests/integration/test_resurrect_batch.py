"""resurrect.lua and resurrected.lua take a batch of tasks per call; each task in a
batch gets the answer it would get alone."""

from __future__ import annotations

import base64
import json

from relier_django.core import config, idempotency, producer
from relier_django.core.connection import sync_client
from relier_django.core.keys import KeySpace
from relier_django.core.resurrector import SCRIPT_BATCH, Resurrector
from testproject.demo import tasks

KEYS = KeySpace("rl")


class RecordingApp:
    """Stands in for Celery's publish only; every Redis step is the real one."""

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
    from relier_django.core.envelope import decode
    from relier_django.core.signing import key_id

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
