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

**A pop that leaves a trace.** kombu's worker waits on ``BRPOP`` over its queues. A
worker SIGKILLed while that command is outstanding leaves it to Redis, which pops the
next message pushed into a socket the kernel has not closed yet: gone, its task
covered only by ``QUEUED_GRACE_S``. A worker given a :class:`Taker` (``use_taker``:
``worker/intake.py`` installs one) takes every message with a script instead: on the
store's own Redis ``take.lua``, which pops it and marks its task held by the worker in
one step; on another Redis, ``take_inflight.lua``, which keeps a copy in the worker's
in-flight record (:func:`inflight_of`) until the worker registered it. It waits, when
every queue is empty, on the queues' *doorbells*
(:func:`bell_of`) with ``BZPOPMIN``, which pops only a doorbell. Whoever queues a
message rings its list's doorbell (this transport's publishes, ``commit.lua``, and
``push.lua`` when its message makes the list non-empty, the taker of each message
ringing again while more wait); a message queued without a ring (another transport's producer, a
kombu restore) waits at most one ``brpop_timeout`` (1 s), after which the worker asks
again anyway.

**Priorities: a higher number is taken first**, as on RabbitMQ and in django.tasks,
where kombu's own Redis transport takes priority 0 first. The lists are kombu's (a
message of priority ``p`` is queued on ``queue`` + sep + ``p``, priority 0 or none on
the plain list, so a message any producer queues lands where kombu would put it); only
the order they are asked in is reversed: 9 first, the plain list last. Every level is
its own list (``priority_steps`` 0..9, kombu's default is four) and a consumer asks all
ten whatever its ``priority_steps``, so no message waits on a list nobody asks. So that
a stream of urgent messages never starves the rest, every :data:`LOWEST_EVERY`-th take
of a channel asks the levels lowest first: of any :data:`LOWEST_EVERY` takes in a row
that found a message, at least one is of the lowest priority then waiting
(docs/priorities.md states the bound).

Enable it with ``CELERY_BROKER_TRANSPORT`` (``Transport`` for ``redis://`` brokers,
``SentinelTransport`` for ``sentinel://``); publishing is kombu's, plus the doorbell.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from queue import Empty
from typing import Any, Protocol

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
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
        taking = getattr(self.channel, "_taking", None)
        if isinstance(taking, _Taking):
            try:
                with self.channel.conn_or_acquire(client) as conn:
                    taking.taker.release(conn)
            except Exception as exc:
                logger.warning("could not drop this worker's in-flight record: %s", exc)

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
        self.last: str | None = None  # the queue of the last message taken

    def rotate(self, last_used: str) -> None:
        # kombu calls it with the queue of every message it takes.
        self.last = last_used
        super().rotate(last_used)

    def consume(self, n: int) -> list[str]:
        # sorted() is stable: the recovery queue moves to the front, the rest keep the
        # round robin's order.
        return sorted(super().consume(n), key=lambda queue: queue != self.first)


def _recovery_first(channel: Any) -> None:
    channel._queue_cycle = RecoveryFirst(config.current().recovery_queue)


LEVELS = tuple(range(10))
"""Every priority level, each its own list (kombu's ``priority_steps``)."""

LOWEST_EVERY = 10
"""A channel's every 10th take asks the priority levels lowest first: the lowest
priority waiting is taken at least once in any 10 takes in a row (the starvation
bound)."""


def ask_order(channel: Any, queues: Sequence[str], lowest_first: bool = False) -> list[str]:
    """The lists of ``queues`` (without kombu's global prefix) in the order to ask them:
    the recovery queue's first (a resurrected task waits for nothing), then level by
    level, highest priority first (``lowest_first``: the fairness turn), the queues in
    the given order within a level."""
    levels = LEVELS if lowest_first else LEVELS[::-1]
    first = getattr(channel._queue_cycle, "first", None)
    head = [channel._q_for_pri(first, pri) for pri in LEVELS[::-1] if first in queues]
    rest = [queue for queue in queues if queue != first]
    return head + [channel._q_for_pri(queue, pri) for pri in levels for queue in rest]


_BELL = "\x06\x16bell"  # kombu's separator, then a name no priority level takes


def bell_of(queue_list: str) -> str:
    """The doorbell of one of kombu's queue lists (its full key, global prefix and
    priority included): a sorted set of at most one member, rung (``ZADD``) whenever a
    message is queued on the list; a waiting worker pops it (``BZPOPMIN``) and then
    takes the message with ``take.lua``."""
    return queue_list + _BELL


RING = ("ring", 0)
"""The doorbell's one member and its score: ringing twice is ringing once."""


def inflight_of(worker: str) -> str:
    """The in-flight record of a worker that takes with ``take_inflight.lua`` (a Redis
    broker that is not the store): a hash of the relier messages it took and has not
    registered yet, in the broker's keyspace (kombu's ``global_keyprefix`` not
    included). The scanner that finds the worker dead puts them back
    (``recovery/inflight.py``)."""
    return f"_relier.inflight.{worker}"


class Taker(Protocol):
    """How a channel takes one message (``worker/intake.py``): the command to send on
    the channel's connection, and its reply read back."""

    def command(self, queue_lists: Sequence[str], bells: Sequence[str]) -> list[Any]:
        """The command that takes the next message of ``queue_lists`` (full keys, in
        the order to ask them)."""

    def taken(self, reply: Any) -> tuple[str, str] | None:
        """``(queue list, message)`` from the command's reply; None when every list
        was empty."""

    def failed(self, error: redis.exceptions.ResponseError) -> bool:
        """An error reply to the command: True when the next command mends it (a
        script Redis no longer has), False to raise it."""

    def release(self, client: Any) -> None:
        """The channel closes on purpose (a warm shutdown), every message it did not
        start put back: drop what the taker kept of its takes (``client``: kombu's
        redis client of the channel)."""


_taker_factory: Callable[[Any], Taker | None] | None = None


def use_taker(factory: Callable[[Any], Taker | None] | None) -> None:
    """Install how this process's channels take messages: ``factory(channel)`` gives a
    channel its :class:`Taker`, or None to keep kombu's ``BRPOP`` (a broker that is not
    the store's Redis). Called by the worker before it consumes; None uninstalls."""
    global _taker_factory
    _taker_factory = factory


class _Unset:
    pass


class _Taking:
    """A channel's :class:`Taker` and what its connection is waiting for."""

    def __init__(self, taker: Taker) -> None:
        self.taker = taker
        self.idle = False  # the last take found every queue empty: wait on the doorbells
        self.pending: str | None = None  # "take" or "bells" while a reply is awaited
        self.fair = False  # the take awaited asks the priority levels lowest first


def _put_ringing(channel: Any, queue: str, message: Any, **kwargs: Any) -> None:
    """kombu's publish, with the list's doorbell rung in the same round trip. (kombu's
    client and pipelines add its ``global_keyprefix`` to both keys.)"""
    key = channel._q_for_pri(queue, channel._get_message_priority(message, reverse=False))
    ring = (bell_of(key), {RING[0]: RING[1]})
    batch = kwargs.get("_publish_batch")
    if batch is not None:
        kombu_redis.Channel._put(channel, queue, message, **kwargs)
        batch.add("zadd", *ring)
        return
    with channel.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
        pipe.lpush(key, dumps(message))
        pipe.zadd(*ring)
        if channel._expires and queue in channel._expires:
            for pri in channel.priority_steps:
                pipe.pexpire(channel._q_for_pri(queue, pri), channel._expires[queue])
        pipe.execute()


class _Takes(kombu_redis.Channel):
    """The consuming side of :class:`Channel` and :class:`SentinelChannel`: a channel
    given a :class:`Taker` takes with it and waits on doorbells; one given none keeps
    kombu's ``BRPOP``."""

    priority_steps = list(LEVELS)  # one list per level (kombu's default is four)
    _taking: _Taking | _Unset | None = _Unset()
    _takes_since_lowest = 0  # takes that found a message since the last fairness turn
    # kombu's, typed here: the connection a command is awaited on, and since when.
    _in_poll: Any = False
    _brpop_sent_at: Any = None

    def _taking_now(self) -> _Taking | None:
        if isinstance(self._taking, _Unset):
            taker = _taker_factory(self) if _taker_factory is not None else None
            self._taking = _Taking(taker) if taker is not None else None
        return self._taking

    def _fair_turn(self) -> bool:
        return self._takes_since_lowest >= LOWEST_EVERY - 1

    def _took(self, fair: bool) -> None:
        # A take from the recovery queue (asked first, always) is outside the bound.
        cycle = self._queue_cycle
        if isinstance(cycle, RecoveryFirst) and cycle.last == cycle.first:
            return
        self._takes_since_lowest = 0 if fair else self._takes_since_lowest + 1

    def _brpop_start(self, timeout: float | None = None) -> None:
        taking = self._taking_now()
        if taking is None:
            self._brpop_plain(timeout)
            return
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        taking.fair = self._fair_turn()
        lists, bells = self._asked(queues, taking.fair)
        connection = self.client.connection
        self._in_poll = connection
        self._brpop_sent_at = time.monotonic()
        if taking.idle:
            taking.pending = "bells"
            wait = self.brpop_timeout if timeout is None else timeout
            connection.send_command("BZPOPMIN", *bells, wait or 0)
        else:
            taking.pending = "take"
            connection.send_command(*taking.taker.command(lists, bells))

    def _asked(self, queues: list[str], fair: bool) -> tuple[list[str], list[str]]:
        # The lists of one queue order and their doorbells are the same at every take of
        # a busy worker: worked out once (about 9 us of the main process per take).
        key = (*queues, fair)
        asks = self.__dict__.setdefault("_asks", {})
        if key not in asks:
            prefix = self.global_keyprefix or ""
            lists = [prefix + name for name in ask_order(self, queues, fair)]
            asks[key] = (lists, [bell_of(queue_list) for queue_list in lists])
        return asks[key]  # type: ignore[no-any-return]

    def _brpop_plain(self, timeout: float | None) -> None:
        # kombu's BRPOP, its keys in this transport's order (highest priority first).
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        self._plain_fair = self._fair_turn()
        wait = self.brpop_timeout if timeout is None else timeout
        keys = [*ask_order(self, queues, self._plain_fair), wait or 0]
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        command = ["BRPOP", *keys]
        if self.global_keyprefix:
            command = self.client._prefix_args(command)
        self.client.connection.send_command(*command)

    _plain_fair = False

    def _get(self, queue: str, timeout: Any = None) -> Any:
        # basic_get: kombu's, highest priority first.
        with self.conn_or_acquire() as client:
            for key in ask_order(self, [queue]):
                item = client.rpop(key)
                if item:
                    self._maybe_update_queues_expire(client, queue)
                    return loads(bytes_to_str(item))
            self._maybe_update_queues_expire(client, queue)
            raise Empty()

    def _brpop_read(self, **options: Any) -> bool:
        taking = self._taking_now()
        if taking is None or taking.pending is None:
            got = bool(super()._brpop_read(**options))
            if got:
                self._took(self._plain_fair)
            return got
        pending, taking.pending = taking.pending, None
        command = "BZPOPMIN" if pending == "bells" else "EVALSHA"
        try:
            try:
                reply = self.client.parse_response(self.client.connection, command, **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            except redis.exceptions.ResponseError as exc:
                if not taking.taker.failed(exc):
                    raise
                raise Empty() from exc
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()
        if pending == "bells":  # rung, or the wait ran out: ask the queues again
            taking.idle = False
            raise Empty()
        taken = taking.taker.taken(reply)
        if taken is None:
            taking.idle = True
            raise Empty()
        queue_list, message = taken
        queue = queue_list[len(self.global_keyprefix or "") :].rsplit(self.sep, 1)[0]
        self._queue_cycle.rotate(queue)
        self._took(taking.fair)
        self.connection._deliver(loads(bytes_to_str(message)), queue)
        return True

    _put = _put_ringing


class Channel(_Takes):
    QoS = QoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _recovery_first(self)


class Transport(kombu_redis.Transport):
    """kombu's ``redis://`` transport with :class:`QoS`."""

    Channel = Channel


class SentinelChannel(_Takes, kombu_redis.SentinelChannel):
    QoS = QoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _recovery_first(self)


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's ``sentinel://`` transport with :class:`QoS`."""

    Channel = SentinelChannel
