"""push.lua stores and queues a task in one step when the broker is kombu's Redis
transport on the store's own server and database (the test suite's setup)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import redis

from relier_django.core.broker import publish
from relier_django.core.model import config
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from testproject.celery import app
from testproject.demo import tasks
from testproject.harness import CeleryWorker, RedisServer, process_pointed_at

KEYS = KeySpace("rl")


def test_push_queues_the_message_in_the_script_that_stores_it(redis_client, monkeypatch):
    monkeypatch.setattr(publish, "send", _no_publish)
    receipt = tasks.record.push("one-step")
    (raw,) = redis_client.lrange("celery", 0, -1)
    message = json.loads(raw)
    # The message Celery and kombu built, as kombu would have pushed it.
    assert message["headers"]["id"] == receipt.task_id
    assert message["headers"]["task"] == "demo.record"
    assert message["properties"]["delivery_info"]["routing_key"] == "celery"
    assert redis_client.hget(KEYS.task(receipt.task_id), "state") == b"queued"


def test_a_queued_push_runs_on_a_worker(worker, redis_client):
    assert tasks.record.push("one-step-runs").get(timeout=30)["runs"] == 1


def test_a_replayed_call_queues_the_message_once(redis_client):
    """A client retry after a lost reply re-runs push.lua: stored once, queued once."""
    client = sync_client(config.current())
    env = producer.prepare(tasks.record.relier_spec, ("replayed",), {})
    encoded = env.encode()
    message = publish.message_for_store(app, env, encoded, client)
    assert message is not None
    call = idempotency.store(KEYS, env, encoded, 60_000, 3, message=message)
    assert call.run(client) == call.run(client) == idempotency.StoreResult(True, env.id)
    assert redis_client.llen("celery") == 1


def test_an_idempotent_duplicate_queues_nothing(redis_client):
    first = tasks.charge.push("o-queued", 1)
    again = tasks.charge.push("o-queued", 1)
    assert again.deduplicated and again.task_id == first.task_id
    assert redis_client.llen("celery") == 1


def test_a_broker_on_another_database_is_published_to_after_the_store(redis_server, redis_client):
    other_db = redis_server.url.rsplit("/", 1)[0] + "/5"
    with process_pointed_at({"CELERY_BROKER_URL": other_db}):
        client = sync_client(config.current())
        env = producer.prepare(tasks.record.relier_spec, ("elsewhere",), {})
        # Not the store's database: push.lua cannot reach the broker's list.
        assert publish.message_for_store(app, env, env.encode(), client) is None
        receipt = tasks.record.push("elsewhere")
    broker_db = redis.Redis.from_url(other_db)
    try:
        (raw,) = broker_db.lrange("celery", 0, -1)
        assert json.loads(raw)["headers"]["id"] == receipt.task_id
        assert redis_client.llen("celery") == 0
        assert redis_client.exists(KEYS.task(receipt.task_id))
    finally:
        broker_db.flushdb()
        broker_db.close()


def test_kombus_global_keyprefix_is_applied_to_the_queue_list(redis_client, monkeypatch):
    monkeypatch.setattr(publish, "send", _no_publish)
    options = {**app.conf.broker_transport_options, "global_keyprefix": "tenant-a:"}
    with process_pointed_at({}, broker_transport_options=options):
        receipt = tasks.record.push("prefixed")
    assert redis_client.llen("celery") == 0
    (raw,) = redis_client.lrange("tenant-a:celery", 0, -1)  # where kombu's consumer reads
    assert json.loads(raw)["headers"]["id"] == receipt.task_id


def _no_publish(*args, **kwargs):
    raise AssertionError("push published on its own: push.lua should have queued it")


def test_over_a_unix_socket_a_push_is_stored_then_published_and_runs_once(monkeypatch):
    """The fallback architecture.md names for a unix socket: push.lua cannot queue the
    message (the lane is TCP only), so push stores, then publishes through kombu."""
    directory = Path(tempfile.mkdtemp(prefix="rl-sock"))  # short: a socket path has a limit
    sock = directory / "redis.sock"
    server = RedisServer(directory=directory, extra_args=("--unixsocket", str(sock))).start()
    relier_url, broker_url = f"unix://{sock}?db=0", f"redis+socket://{sock}"
    worker = CeleryWorker(
        redis_url=relier_url,
        log_dir=directory,
        extra_env={"CELERY_BROKER_URL": broker_url, "CELERY_BROKER_TRANSPORT": "redis"},
    )
    sent = []
    real_send = publish.send

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(args[1].id)
        return real_send(*args, **kwargs)

    monkeypatch.setattr(publish, "send", counted)
    try:
        worker.start()
        env = {"RELIER_REDIS_URL": relier_url, "CELERY_BROKER_URL": broker_url}
        with process_pointed_at(env, broker_transport="redis"):
            receipt = tasks.record.push("over-a-socket")
            assert sent == [receipt.task_id]  # published by kombu, not by push.lua
            assert receipt.get(timeout=30)["runs"] == 1
        with redis.Redis(unix_socket_path=str(sock), decode_responses=True) as client:
            assert client.llen("demo:exec:over-a-socket") == 1
    finally:
        worker.stop()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_replay_that_fails_to_publish_never_undoes_the_identical_one_that_sent(
    redis_server, redis_client, monkeypatch
):
    """G1/G10: two replay()s of one logged envelope (a broker apart from the store): the
    second is told "stored" too, and when its publish fails, its undo must not delete
    the task whose message the first one sent (that message would be refused as gone:
    no run, no DLQ entry)."""
    other_db = redis_server.url.rsplit("/", 1)[0] + "/5"
    broker_db = redis.Redis.from_url(other_db)
    try:
        with process_pointed_at({"CELERY_BROKER_URL": other_db}):
            env = producer.prepare(tasks.record.relier_spec, ("replayed-twice",), {})
            text = env.encode()
            assert producer.replay(app, text).task_id == env.id
            monkeypatch.setattr(publish, "send", _broker_down)
            with pytest.raises(ConnectionError, match="broker down"):
                producer.replay(app, text)
        (raw,) = broker_db.lrange("celery", 0, -1)
        assert json.loads(raw)["headers"]["id"] == env.id
        assert redis_client.hget(KEYS.task(env.id), "state") == b"queued"
        assert redis_client.zscore(KEYS.expiry, env.id) is not None
    finally:
        broker_db.flushdb()
        broker_db.close()


def test_a_failed_publish_still_undoes_a_push_nobody_else_counts_on(redis_server, redis_client):
    """The undo still works for the push it is for (G4: a push that raised leaves no claim)."""
    client = sync_client(config.current())
    env = producer.prepare(tasks.charge.relier_spec, ("o-undo", 1), {})
    first = idempotency.store(KEYS, env, env.encode(), 60_000, 3, token="a")
    again = idempotency.store(KEYS, env, env.encode(), 60_000, 3, token="b")
    assert first.run(client).stored and again.run(client).stored
    assert not idempotency.abort(KEYS, env, "b").run(client)  # "a" still counts on it
    assert redis_client.exists(KEYS.task(env.id))
    assert idempotency.abort(KEYS, env, "a").run(client)  # the last one undoes it
    assert idempotency.abort(KEYS, env, "a").run(client)  # and a replay answers the same
    assert not redis_client.exists(KEYS.task(env.id), KEYS.idempotency(env.task, env.idem_key))


def _broker_down(*args, **kwargs):  # type: ignore[no-untyped-def]
    raise ConnectionError("broker down")
