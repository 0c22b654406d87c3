"""take.lua and the transport's doorbells (G15: a pop that leaves a trace), on a real
Redis with kombu's real consumer.

A message leaves its queue only with its task marked held by the taker and due within
one heartbeat TTL; a worker waiting for work pops only doorbells. The whole-worker
SIGKILL this closes is in tests/chaos/test_pop_trace.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from relier_django.core.broker import redis_channel
from relier_django.core.broker.marker import MARKER_HEADER
from relier_django.core.model import config
from relier_django.core.push import idempotency, producer
from relier_django.core.store.connection import sync_client
from relier_django.core.store.keys import KeySpace
from relier_django.core.worker import intake
from relier_django.transport import Transport
from testproject.celery import app
from testproject.demo import tasks

KEYS = KeySpace("rl")
WORKER = "taker@host:1"
QUEUE = Queue("tq", Exchange("tq", type="direct"), routing_key="tq")


@pytest.fixture
def connection(redis_server, redis_client) -> Iterator[Connection]:
    conn = Connection(redis_server.url, transport=Transport)
    try:
        yield conn
    finally:
        conn.release()


@pytest.fixture
def store(redis_client):  # type: ignore[no-untyped-def]
    """The store's own client (decoded replies), on the flushed private server."""
    return sync_client(config.current())


@pytest.fixture
def taking(redis_client) -> Iterator[None]:
    """This process's channels take with take.lua, as a worker's do."""
    intake.install(config.current(), WORKER)
    try:
        yield
    finally:
        redis_channel.use_taker(None)


def _stored(label: str, queue: str = "tq") -> str:
    """A task stored 'queued' at fence 1 (push.lua), its message not sent."""
    env = producer.prepare(tasks.record.relier_spec, (label,), {}, queue=queue)
    client = sync_client(config.current())
    assert idempotency.store(KEYS, env, env.encode(), 3_600_000, 3).run(client).stored
    return env.id


def _publish(conn: Connection, task_id: str, fence: int | None) -> None:
    # Celery's message protocol 2 names the task id in the headers.
    headers = {"id": task_id, **({MARKER_HEADER: fence} if fence is not None else {})}
    Producer(conn.default_channel).publish(
        "x", exchange=QUEUE.exchange, routing_key="tq", declare=[QUEUE], headers=headers
    )


def _take(client, lists: list[str], worker: str = WORKER):  # type: ignore[no-untyped-def]
    return _take_with(client, intake.Intake(config.current(), worker), lists)


def _take_with(client, taker, lists: list[str]):  # type: ignore[no-untyped-def]
    bells = [redis_channel.bell_of(name) for name in lists]
    try:
        reply = client.execute_command(*taker.command(lists, bells))
    except redis.exceptions.NoScriptError as exc:  # as the channel does: EVAL once
        assert taker.failed(exc)
        reply = client.execute_command(*taker.command(lists, bells))
    return taker.taken(reply)


def test_a_taken_message_marks_its_task_held_by_the_taker_in_the_same_step(connection, store):
    task_id = _stored("t1")
    _publish(connection, task_id, fence=1)
    before = store.zscore(KEYS.expiry, task_id)
    taken = _take(store, ["tq"])
    assert taken is not None and taken[0] == "tq"
    assert store.llen("tq") == 0
    assert store.hget(KEYS.task(task_id), "worker") == WORKER
    # Due within one heartbeat TTL, no longer the queued grace's hour.
    ttl_ms = config.current().heartbeat_ttl_s * 1000
    assert store.zscore(KEYS.expiry, task_id) < before - 3_000_000
    assert store.zscore(KEYS.expiry, task_id) <= time.time() * 1000 + ttl_ms + 1000


def test_a_stale_copy_or_a_message_not_relier_s_is_taken_and_marks_nothing(connection, store):
    task_id = _stored("t2")
    _publish(connection, task_id, fence=7)  # not the task's fence: a stale copy
    _publish(connection, "plain-1", fence=None)  # no marker: kombu's own message
    assert _take(store, ["tq"]) is not None
    assert _take(store, ["tq"]) is not None
    assert _take(store, ["tq"]) is None  # empty: false, nothing popped
    assert store.hget(KEYS.task(task_id), "worker") is None
    assert store.exists(KEYS.task("plain-1")) == 0


def test_take_asks_the_lists_in_order_and_rings_again_while_messages_wait(connection, store):
    store.lpush("low", "a", "b")
    store.lpush("high", "c")
    assert _take(store, ["high", "low"]) == ("high", "c")
    assert store.exists(redis_channel.bell_of("high")) == 0  # nothing left there
    assert _take(store, ["high", "low"]) == ("low", "a")
    # "b" still waits: the doorbell is rung for another waiting worker.
    assert store.zrange(redis_channel.bell_of("low"), 0, -1) == [redis_channel.RING[0]]


def _priority_lists(queue: str) -> list[str]:
    """A queue's ten lists in a worker's ask order (highest priority first)."""
    return [f"{queue}\x06\x16{p}" for p in range(9, 0, -1)] + [queue]


def test_a_take_asks_every_list_in_one_command(connection, store):
    """A worker asks twenty lists or more (two queues' ten priority levels): one LMPOP
    asks them all in order, not an RPOP of each empty list before the message."""
    lists = _priority_lists("relier.recovery") + _priority_lists("tq")
    store.lpush("tq", "m")
    store.config_resetstat()
    assert _take(store, lists) == ("tq", "m")
    assert _take(store, lists) is None
    calls = store.info("commandstats")
    assert calls["cmdstat_lmpop"]["calls"] == 2
    assert "cmdstat_rpop" not in calls


def test_a_server_without_lmpop_is_asked_list_by_list(redis_server, connection, store):
    """Redis before 7.0 has no LMPOP: the take asks each list in order with RPOP. (A user
    denied LMPOP stands in for such a server: the script's call is refused the same way.)"""
    store.acl_setuser("pre7", enabled=True, nopass=True, keys=["*"], channels=["*"],
                      commands=["+@all", "-lmpop"])  # fmt: skip
    old = redis.Redis(port=redis_server.port, username="pre7", decode_responses=True)
    try:
        old.lpush("tq", "a", "b")
        old.lpush("tq\x06\x164", "c")
        lists = _priority_lists("tq")
        assert _take(old, lists) == ("tq\x06\x164", "c")
        assert _take(old, lists) == ("tq", "a")
        assert store.zrange(redis_channel.bell_of("tq"), 0, -1) == [redis_channel.RING[0]]
        assert _take(old, lists) == ("tq", "b")
        assert _take(old, lists) is None
    finally:
        old.close()
        store.acl_deluser("pre7")


def test_of_many_takers_at_once_each_message_is_taken_once_and_marked_by_its_taker(
    connection, store
):
    ids = [_stored(f"race-{i}") for i in range(60)]
    for task_id in ids:
        _publish(connection, task_id, fence=1)
    got: dict[str, list[str]] = {f"w{i}@host:{i}": [] for i in range(6)}

    def drain(worker: str) -> None:
        client = sync_client(config.current())
        while (taken := _take(client, ["tq"], worker)) is not None:
            got[worker].append(taken[1])

    threads = [threading.Thread(target=drain, args=(w,)) for w in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken_ids = [store.hget(KEYS.task(task_id), "worker") for task_id in ids]
    assert sum(len(v) for v in got.values()) == 60  # each message once
    assert sorted(taken_ids) == sorted(
        worker for worker, messages in got.items() for _ in messages
    )  # each task marked by the worker that took its message


def test_a_consumer_takes_with_take_lua_and_sleeps_on_the_doorbells(connection, store, taking):
    """kombu's real consumer, given a taker: idle, it waits on the doorbells (a publish
    through this transport rings one); each message it gets was marked held by it."""
    channel = connection.channel()
    got: list = []
    consumer = Consumer(channel, [QUEUE], callbacks=[lambda body, m: got.append(m)])
    consumer.consume()
    with pytest.raises(TimeoutError):  # nothing queued: the wait pops nothing
        connection.drain_events(timeout=1.5)
    task_id = _stored("t3")
    _publish(connection, task_id, fence=1)
    while not got:
        connection.drain_events(timeout=5)
    assert got[0].headers["id"] == task_id
    assert store.hget(KEYS.task(task_id), "worker") == WORKER
    assert intake.takes_here()
    consumer.cancel()


def test_every_way_a_message_is_queued_rings_its_doorbell(connection, store):
    """A waiting worker wakes as soon as a message is queued, whoever queued it: a
    publish through this transport, push.lua (the store's own Redis), commit.lua's
    successor (tests/integration/workflows/test_chain.py runs it with real workers)."""
    _publish(connection, "plain-2", fence=None)
    assert store.zcard(redis_channel.bell_of("tq")) == 1
    store.delete(redis_channel.bell_of("celery"))
    receipt = tasks.record.push("rung")
    assert store.llen("celery") == 1, "push.lua queued the message itself"
    assert store.zcard(redis_channel.bell_of("celery")) == 1
    assert receipt.task_id


def test_a_worker_takes_its_messages_with_take_lua(worker_factory, store):
    from relier_django.core.store import scripts

    store.script_flush()
    worker_factory()
    receipt = tasks.record.push("by-a-worker")
    assert receipt.get(timeout=30)["label"] == "by-a-worker"
    assert store.script_exists(scripts.TAKE.sha) == [True]
    assert app.conf.broker_url == config.current().redis_url


# --- a Redis broker that is not the store: take_inflight.lua, restore_inflight.lua ----


def test_a_take_apart_from_the_store_keeps_a_relier_message_until_the_next_take(connection, store):
    """The copy covers the message from its pop until its taker registered it (Celery
    sends task_received while it delivers, before the channel takes again); a message
    that is not relier's keeps kombu's handling and no copy."""
    taker = intake.InflightIntake(WORKER)
    record = redis_channel.inflight_of(WORKER)
    _publish(connection, "kept-1", fence=1)
    _publish(connection, "plain-3", fence=None)
    first = _take_with(store, taker, ["tq"])
    assert first is not None and '"relier_fence"' in first[1]
    assert store.hlen(record) == 2  # the counter and one copy
    second = _take_with(store, taker, ["tq"])
    assert second is not None and '"relier_fence"' not in second[1]
    assert store.hkeys(record) == ["#"]  # the first one's copy dropped by this take
    assert _take_with(store, taker, ["tq"]) is None


def test_a_dead_takers_copies_go_back_to_the_head_of_their_queues_once(connection, store):
    from relier_django.core.recovery import inflight
    from testproject.celery import app as celery_app

    taker = intake.InflightIntake(WORKER)
    for label in ("a", "b", "c"):
        _publish(connection, f"kept-{label}", fence=1)
    taken = [_take_with(store, taker, ["tq"]) for _ in range(2)]  # a, then b: a's dropped
    _publish(connection, "kept-d", fence=1)  # waits behind c
    assert inflight.restore(celery_app, [WORKER]) == 1  # b: taken, never registered
    assert inflight.restore(celery_app, [WORKER]) == 1  # answered the same, nothing more
    assert [json.loads(m)["headers"]["id"] for m in reversed(store.lrange("tq", 0, -1))] == [
        "kept-b", "kept-c", "kept-d",
    ]  # fmt: skip
    assert taken[1] is not None and json.loads(taken[1][1])["headers"]["id"] == "kept-b"


def test_a_worker_that_shuts_down_drops_its_in_flight_record(connection, store):
    taker = intake.InflightIntake(WORKER)
    _publish(connection, "kept-e", fence=1)
    assert _take_with(store, taker, ["tq"]) is not None
    assert store.exists(redis_channel.inflight_of(WORKER)) == 1
    with connection.channel().conn_or_acquire() as client:
        taker.release(client)
    assert store.exists(redis_channel.inflight_of(WORKER)) == 0


def test_of_many_takers_apart_from_the_store_each_message_is_taken_and_kept_once(connection, store):
    """take_inflight.lua's race: six takers drain one queue at once; each message is
    taken once and kept once, in its taker's record, until that taker's next take
    (which finds the queue empty at the end) drops it."""
    for i in range(60):
        _publish(connection, f"race-kept-{i}", fence=1)
    takers = {f"w{i}@host:{i}": intake.InflightIntake(f"w{i}@host:{i}") for i in range(6)}
    got: dict[str, list[str]] = {worker: [] for worker in takers}

    def drain(worker: str) -> None:
        client = sync_client(config.current())
        while (taken := _take_with(client, takers[worker], ["tq"])) is not None:
            got[worker].append(json.loads(taken[1])["headers"]["id"])

    threads = [threading.Thread(target=drain, args=(w,)) for w in takers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(i for ids in got.values() for i in ids) == sorted(
        f"race-kept-{i}" for i in range(60)
    )
    for worker, ids in got.items():
        kept = store.hgetall(redis_channel.inflight_of(worker))
        assert int(kept.get("#", 0)) == len(ids)  # a copy kept per message it took
        assert set(kept) <= {"#"}  # each dropped by the take after it


def test_a_taking_consumer_asks_the_recovery_queue_first(connection, store, taking):
    """The take asks the lists in BRPOP's order, the recovery queue first: a resurrected
    task is the next message a worker takes, whatever its other queues hold."""
    backlog = Queue("celery", Exchange("celery", type="direct"), routing_key="celery")
    recovery_name = config.current().recovery_queue
    recovery = Queue(
        recovery_name, Exchange(recovery_name, type="direct"), routing_key=recovery_name
    )
    producer = Producer(connection.default_channel)
    for i in range(5):
        producer.publish(f"backlog-{i}", exchange=backlog.exchange, routing_key="celery",
                         declare=[backlog])  # fmt: skip
    producer.publish("resurrected", exchange=recovery.exchange, routing_key=recovery_name,
                     declare=[recovery])  # fmt: skip
    got: list[str] = []
    with Consumer(connection.channel(), [backlog, recovery], callbacks=[
        lambda body, message: (got.append(body), message.ack())
    ], prefetch_count=1):  # fmt: skip
        while len(got) < 2:
            connection.drain_events(timeout=5)
    assert got[0] == "resurrected"
