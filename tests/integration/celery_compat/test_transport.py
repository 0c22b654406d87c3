"""relier_django's Redis transport: kombu's, minus the unacked copies of relier's own
messages; every other message keeps kombu's ack emulation. Real Redis, real kombu."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Iterator

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

from relier_django.core.broker.marker import MARKER_HEADER
from relier_django.transport import Transport
from testproject.demo import tasks
from testproject.harness import RedisServer, make_tls_files, redis_server

QUEUE = Queue("tq", Exchange("tq", type="direct"), routing_key="tq")


@pytest.fixture
def connection(redis_server, redis_client) -> Iterator[Connection]:
    conn = Connection(redis_server.url, transport=Transport)
    try:
        yield conn
    finally:
        conn.release()


def _publish(conn: Connection, body: str, relier: bool) -> None:
    headers = {MARKER_HEADER: 1} if relier else {}
    Producer(conn.default_channel).publish(
        body, exchange=QUEUE.exchange, routing_key="tq", declare=[QUEUE], headers=headers
    )


def _bodies(redis_client) -> list[str]:
    """The queue's messages' bodies, left to right (kombu base64-encodes them)."""
    out = []
    for raw in redis_client.lrange("tq", 0, -1):
        payload = json.loads(raw)
        out.append(base64.b64decode(payload["body"]).decode())
    return out


def _receive(conn: Connection, n: int, prefetch: int = 0) -> list:
    got: list = []
    channel = conn.channel()
    consumer = Consumer(channel, [QUEUE], callbacks=[lambda body, message: got.append(message)])
    consumer.qos(prefetch_count=prefetch)
    consumer.consume()
    while len(got) < n:
        conn.drain_events(timeout=5)
    return got


def test_only_messages_without_the_marker_get_kombus_unacked_copy(connection, redis_client):
    _publish(connection, "plain", relier=False)
    _publish(connection, "ours", relier=True)
    got = _receive(connection, 2)
    channel = got[0].channel
    held = {json.loads(raw)[0]["body"] for raw in redis_client.hvals(channel.unacked_key)}
    assert len(held) == 1 and redis_client.zcard(channel.unacked_index_key) == 1
    assert {m.headers.get(MARKER_HEADER) for m in got} == {None, 1}
    for message in got:
        message.ack()
    assert redis_client.hlen(channel.unacked_key) == 0
    assert redis_client.zcard(channel.unacked_index_key) == 0


def test_relier_messages_still_count_against_the_prefetch_limit(connection):
    for i in range(3):
        _publish(connection, f"ours-{i}", relier=True)
    got = _receive(connection, 2, prefetch=2)
    qos = got[0].channel.qos
    assert not qos.can_consume()  # two held, none acked: no third BRPOP
    got[0].ack()
    assert qos.can_consume()


def test_a_requeued_reject_puts_the_message_back_as_kombu_would(connection, redis_client):
    _publish(connection, "first", relier=True)
    _publish(connection, "second", relier=True)
    first = _receive(connection, 1, prefetch=1)[0]
    assert first.decode() == "first"
    first.reject(requeue=True)
    # kombu pops from the right; a rejected message goes back on the left (LPUSH),
    # behind what is waiting, marked as redelivered.
    assert _bodies(redis_client) == ["first", "second"]
    back = json.loads(redis_client.lindex("tq", 0))
    assert back["headers"][MARKER_HEADER] == 1 and back["headers"]["redelivered"] is True


def test_a_closing_channel_puts_back_what_it_did_not_ack(connection, redis_client):
    """kombu's restore at shutdown, for messages it holds in memory only."""
    _publish(connection, "plain", relier=False)
    _publish(connection, "ours", relier=True)
    _publish(connection, "acked", relier=True)
    got = _receive(connection, 3)
    acked = next(m for m in got if m.decode() == "acked")
    acked.ack()
    got[0].channel.close()
    assert sorted(_bodies(redis_client)) == ["ours", "plain"]
    assert redis_client.hlen("unacked") == 0


def test_a_push_marks_its_message(redis_client):
    receipt = tasks.record.push("marked")
    (raw,) = redis_client.lrange("celery", 0, -1)
    message = json.loads(raw)
    assert message["headers"][MARKER_HEADER] == 1
    assert message["headers"]["id"] == receipt.task_id


def test_a_worker_on_kombus_own_transport_runs_relier_tasks(worker_factory, redis_client):
    """Opting out (or a worker not yet upgraded) loses nothing: kombu tracks it all."""
    worker_factory(extra_env={"CELERY_BROKER_TRANSPORT": "redis"})
    assert tasks.record.push("stock-transport").get(timeout=30)["runs"] == 1


def test_over_tls_with_celerys_broker_use_ssl(tmp_path):
    """rediss:// and kombu's ssl options reach the connection through the subclass."""
    files = make_tls_files(tmp_path / "tls")
    server = RedisServer(directory=tmp_path / "redis", tls=files).start()
    try:
        use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(files.ca)}
        url = f"rediss://127.0.0.1:{server.port}/0"
        with Connection(url, transport=Transport, ssl=use_ssl) as conn:
            _publish(conn, "over-tls", relier=True)
            (message,) = _receive(conn, 1)
            assert message.decode() == "over-tls"
            message.ack()
        with server.client() as direct:
            assert direct.llen("tq") == 0 and direct.hlen("unacked") == 0
    finally:
        server.stop()


def test_the_recovery_queue_is_asked_first_whatever_the_other_queues_hold(connection):
    backlog = Queue("celery", Exchange("celery", type="direct"), routing_key="celery")
    recovery = Queue(
        "relier.recovery", Exchange("relier.recovery", type="direct"), routing_key="relier.recovery"
    )
    producer = Producer(connection.default_channel)
    for i in range(5):
        producer.publish(f"backlog-{i}", exchange=backlog.exchange, routing_key="celery",
                         declare=[backlog])  # fmt: skip
    producer.publish("resurrected", exchange=recovery.exchange, routing_key="relier.recovery",
                     declare=[recovery])  # fmt: skip
    got: list[str] = []
    # The backlog's queue is declared first: kombu's round robin alone would ask it first.
    with Consumer(connection.channel(), [backlog, recovery], callbacks=[
        lambda body, message: (got.append(body), message.ack())
    ], prefetch_count=1):  # fmt: skip
        while len(got) < 2:
            connection.drain_events(timeout=5)
    assert got[0] == "resurrected"


def test_a_connection_lost_with_messages_in_hand_is_closed_without_an_error(tmp_path, caplog):
    """A Redis restart while the consumer holds delivered messages: Celery's consumer
    closes the dead connection, and kombu's restore then cannot open one. Before, the
    error escaped and stopped the worker's consumer for good (CI caught a worker that
    never consumed again after a restart); now it is logged, and nothing is lost: the
    relier message's task is in the store, kombu's copy in its unacked hash."""
    with redis_server(tmp_path / "redis") as server:
        conn = Connection(server.url, transport=Transport)
        _publish(conn, "plain", relier=False)
        _publish(conn, "ours", relier=True)
        got = _receive(conn, 2)
        client = server.client()
        assert client.hlen("unacked") == 1  # kombu's copy of the plain one
        server.kill()
        with caplog.at_level("WARNING", logger="relier_django.transport"):
            conn.release()  # what the consumer does with a dead connection
        server.restart()
        assert len(got) == 2
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "could not put 1 relier_django message(s) back" in said
        assert server.client().hlen("unacked") == 1  # kombu restores it after its timeout
