"""How take.lua reads a message and when a push rings a doorbell (issue 37: the work a
task costs its Redis), on a real Redis.

take.lua reads the task id and fence from the message's text with plain finds instead
of decoding the whole message; anything not written as kombu writes it is decoded in
full. Only the header values count: the same words inside an argument's text never do.
push.lua rings a list's doorbell only when its message makes the list non-empty.
"""

from __future__ import annotations

import json
from pathlib import Path

from kombu import Connection, Consumer, Queue

from relier_django.core.broker import redis_channel
from relier_django.core.broker.marker import MARKER_HEADER
from relier_django.core.model import config
from relier_django.core.store import scripts
from relier_django.core.store.connection import sync_client
from relier_django.core.worker import intake
from relier_django.transport import Transport
from testproject.demo import tasks

from .test_take import KEYS, WORKER, _stored, _take


def _message(task_id: str, fence: int, argsrepr: str = "[]", compact: bool = False) -> str:
    """A message as kombu's Redis transport queues it (or with compact separators)."""
    body = {
        "body": "W1tdLCB7fSwge31d",
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": "demo.record", "argsrepr": argsrepr,
                    "root_id": "r-1", "parent_id": None, "id": task_id, MARKER_HEADER: fence},
        "properties": {"correlation_id": task_id, "delivery_tag": "t-1"},
    }  # fmt: skip
    return json.dumps(body, separators=(",", ":")) if compact else json.dumps(body)


def test_a_message_written_otherwise_than_kombu_writes_it_is_read_in_full(redis_client):
    store = sync_client(config.current())
    task_id = _stored("compact")
    store.lpush("tq", _message(task_id, 1, compact=True))
    assert _take(store, ["tq"]) is not None
    assert store.hget(KEYS.task(task_id), "worker") == WORKER


def test_only_the_headers_name_the_task_never_an_argument_s_text(redis_client):
    """An argument that spells a header (argsrepr carries it, JSON-escaped) names no
    task: the task marked is the one the headers name, at their fence."""
    store = sync_client(config.current())
    decoy, task_id = _stored("decoy"), _stored("real")
    argsrepr = f'[\'"id": "{decoy}", "{MARKER_HEADER}": 1\']'
    store.lpush("tq", _message(task_id, 1, argsrepr=argsrepr))
    assert _take(store, ["tq"]) is not None
    assert store.hget(KEYS.task(task_id), "worker") == WORKER
    assert store.hget(KEYS.task(decoy), "worker") is None


def test_an_id_with_an_escape_is_read_in_full(redis_client):
    store = sync_client(config.current())
    task_id = _stored("plain")
    # The same task, its id written with a JSON escape for one of its characters.
    plain = _message(task_id, 1)
    escaped = plain.replace(f'"id": "{task_id}"', f'"id": "\\u{ord(task_id[0]):04x}{task_id[1:]}"')
    assert escaped != plain
    store.lpush("tq", escaped)
    assert _take(store, ["tq"]) is not None
    assert store.hget(KEYS.task(task_id), "worker") == WORKER


def test_a_push_rings_only_when_its_message_makes_the_list_non_empty(redis_client):
    """Behind the first message, the taker of each message rings again while more wait
    (take.lua), so a backlog costs one ring and still wakes one worker per message."""
    store = sync_client(config.current())
    bell = redis_channel.bell_of("celery")
    tasks.record.push("first")
    assert store.zcard(bell) == 1
    store.delete(bell)
    tasks.record.push("second")
    assert store.llen("celery") == 2 and store.zcard(bell) == 0
    assert _take(store, ["celery"]) is not None  # one still waits: rung again
    assert store.zcard(bell) == 1


def test_the_clock_fragment_reads_the_server_s_milliseconds(redis_client):
    """clock() cuts its text from TIME's reply: the same instant as the number, padded
    when the microseconds have fewer than six digits."""
    store = sync_client(config.current())
    fragment = (Path(scripts.__file__).parent / "lua" / "_clock.lua").read_text()
    script = scripts.LuaScript(
        "probe_clock",
        fragment + "local n, text = clock()\nreturn {text, ms(n), redis.call('TIME')}",
    )
    for _ in range(50):
        text, formatted, (secs, micros) = script.run(store, [], [])
        assert text == formatted
        assert 0 <= int(secs) * 1000 + int(micros) // 1000 - int(text) < 50
        assert len(text) == len(str(secs)) + 3


def test_a_kombu_consumer_still_gets_every_message_of_a_backlog(redis_server, redis_client):
    """Two messages pushed while a consumer waits: one ring, both delivered."""
    intake.install(config.current(), WORKER)
    conn = Connection(redis_server.url, transport=Transport)
    try:
        got: list = []
        channel = conn.channel()
        consumer = Consumer(channel, [Queue("celery")], callbacks=[lambda b, m: got.append(m)])
        consumer.consume()
        tasks.record.push("a")
        tasks.record.push("b")
        for _ in range(20):
            if len(got) == 2:
                break
            conn.drain_events(timeout=5)
        assert len(got) == 2
        consumer.cancel()
    finally:
        redis_channel.use_taker(None)
        conn.release()
