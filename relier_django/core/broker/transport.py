"""kombu's Redis transport without its ack emulation for relier_django's own messages.

kombu emulates acknowledgements on Redis: each message a worker pops is copied into an
"unacked" hash and index (one MULTI/EXEC round trip), the copy is deleted on ack
(another), and a copy older than the visibility timeout is pushed back to its queue.
For a relier_django message that bookkeeping protects nothing the store does not
already protect: the envelope is stored before the message is queued, the worker
registers a message as reserved when it arrives (``reservations.py``) and the task
expires and is resurrected if its holder dies, and the window between the pop and
that registration is covered by ``QUEUED_GRACE_S``, exactly as kombu's own window
between the pop and its unacked copy is. Yet the two round trips cost each task more
than any of relier_django's scripts (bench/throughput.py).

So the worker's QoS keeps relier_django's messages (marked by the header
:data:`marker.MARKER_HEADER`) in memory only: they still count against the prefetch
limit, an ack or a reject still settles them, and a worker that shuts down still
puts the ones it did not start back at the head of their queue, as kombu does. Every
other message of the same worker keeps kombu's full ack emulation.

Its channels also ask the recovery queue first (``RecoveryFirst``): a resurrected task
never waits behind the backlog of a worker's other queues.

Enable it with ``CELERY_BROKER_TRANSPORT`` (``Transport`` for ``redis://`` brokers,
``SentinelTransport`` for ``sentinel://``); publishing is kombu's, unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.scheduling import round_robin_cycle

from ..model import config
from .marker import is_relier_message

logger = logging.getLogger("relier_django.transport")


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, tracking relier_django's messages in memory only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_memory: set[str] = set()

    def append(self, message: Any, delivery_tag: str) -> None:
        if is_relier_message(message):
            self._in_memory.add(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if delivery_tag in self._in_memory:
            self._in_memory.discard(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)
            return
        try:
            super().ack(delivery_tag)
        except AttributeError as exc:
            # kombu acks on the channel of a connection that is gone (a Redis restart)
            # and fails to open one; raised, it stops the worker for good. The message
            # stays in kombu's unacked hash and is restored after the visibility
            # timeout, as for any ack lost with a connection.
            virtual.QoS.ack(self, delivery_tag)
            logger.warning("could not ack a message, its connection is gone: %s", exc)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if delivery_tag in self._in_memory:
            self._in_memory.discard(delivery_tag)
            if requeue:
                self._requeue([self._delivered[delivery_tag]], leftmost=True)
            virtual.QoS.ack(self, delivery_tag)
            return
        super().reject(delivery_tag, requeue=requeue)

    def restore_unacked(self, client: Any = None) -> None:
        """At shutdown, or when the broker connection is lost: every message delivered
        and not acked back to its queue.

        Never raises. The consumer calls this while closing a connection that may be
        gone already (a Redis restart), and kombu then fails to open one; an error
        here would stop the consumer for good, and nothing is lost by going on: a
        relier_django message's task is in the store (re-dispatched once its holder's
        heartbeat or the queued grace runs out), and kombu keeps its own messages'
        copies in its unacked hash, restored after the visibility timeout."""
        mine = [m for tag, m in self._delivered.items() if tag in self._in_memory]
        for tag in [t for t in self._delivered if t in self._in_memory]:
            del self._delivered[tag]
        self._in_memory.clear()
        for what, restore in (
            ("relier_django", lambda: self._requeue(mine, leftmost=False, client=client)),
            ("kombu's own", lambda: super(QoS, self).restore_unacked(client)),
        ):
            count = len(mine) if what == "relier_django" else len(self._delivered)
            if not count:
                continue
            try:
                restore()
            except Exception as exc:
                logger.warning(
                    "could not put %d %s message(s) back in their queues (%s: %s); "
                    "they are restored without it (see QoS.restore_unacked)",
                    count, what, type(exc).__name__, exc,
                )  # fmt: skip
        self._delivered.clear()

    def _requeue(self, messages: list[Any], leftmost: bool, client: Any = None) -> None:
        # kombu's own restore (same side of the list, same redelivered flag), from the
        # message held in memory instead of the copy kombu would have kept.
        channel = self.channel
        with channel.conn_or_acquire(client) as conn, conn.pipeline() as pipe:
            for message in messages:
                info = message.delivery_info
                channel._do_restore_message(
                    message._raw, info["exchange"], info["routing_key"], pipe, leftmost
                )
            pipe.execute()
        logger.info("put %d relier_django message(s) back in their queues", len(messages))


class RecoveryFirst(round_robin_cycle):
    """kombu's round robin over a worker's queues, except that the recovery queue is
    always the first key of its BRPOP, which pops from the first non-empty key: a
    resurrected task is taken as soon as the worker takes anything, whatever the other
    queues hold; the others still share the rest fairly."""

    def __init__(self, first: str) -> None:
        super().__init__()
        self.first = first

    def consume(self, n: int) -> list[str]:
        # sorted() is stable: the recovery queue moves to the front, the rest keep the
        # round robin's order.
        return sorted(super().consume(n), key=lambda queue: queue != self.first)


def _recovery_first(channel: Any) -> None:
    channel._queue_cycle = RecoveryFirst(config.current().recovery_queue)


class Channel(kombu_redis.Channel):
    QoS = QoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _recovery_first(self)


class Transport(kombu_redis.Transport):
    """kombu's ``redis://`` transport with :class:`QoS`."""

    Channel = Channel


class SentinelChannel(kombu_redis.SentinelChannel):
    QoS = QoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _recovery_first(self)


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's ``sentinel://`` transport with :class:`QoS`."""

    Channel = SentinelChannel
