"""The only code that hands an envelope to Celery."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kombu import pools
from kombu.entity import Queue
from kombu.transport import redis as kombu_redis

from ..model.envelope import Envelope
from . import redis_channel
from .marker import MARKER_HEADER

_lock = threading.Lock()
_executor: tuple[int, ThreadPoolExecutor] | None = None

# The producer a caller lends for the sends made meanwhile in this context: Celery's
# group and chord apply each member holding one producer of the app's pool and pass it
# on (``apply_async(producer=...)``); taking a second from the pool there would
# deadlock once as many threads as the pool holds do the same (broker_pool_limit, 10).
_lent: contextvars.ContextVar[Any] = contextvars.ContextVar("relier_lent_producer", default=None)
# Celery does not lend its producer everywhere: a chain inside a group or a chord's
# header (Celery's group applies it holding a producer, and the chain applies its first
# task without it) takes a second. So relier's sends that no caller lent a producer to
# take theirs from a pool of relier's own, per app and process: a thread holding one of
# Celery's pool never waits on that pool for relier's send, and relier never holds one
# of its own while it takes another.
_pools: dict[tuple[Any, ...], Any] = {}


@contextlib.contextmanager
def _producing(app: Any) -> Iterator[Any]:
    """The producer lent for this context, else one of relier's own pool."""
    lent = _lent.get()
    if lent is not None or not hasattr(app, "producer_pool"):
        yield lent  # None for an app with no pool of Celery's: it sends its own way
        return
    with _pool(app).acquire(block=True) as producer:
        yield producer


def _pool(app: Any) -> Any:
    connection = app.connection_for_write()  # not connected yet: names the broker
    # A forked process builds its own (sockets are not shared); a broker changed in
    # the settings gets its own.
    where = (connection.as_uri(include_password=True), repr(connection.transport_options))
    key = (id(app), os.getpid(), *where)
    with _lock:
        pool = _pools.get(key)
        if pool is None:
            limit = app.conf.broker_pool_limit or 10
            connections = connection.Pool(limit=limit)
            pool = pools.ProducerPool(connections, limit=limit, Producer=app.amqp.Producer)
            _pools[key] = pool
        return pool


@contextlib.contextmanager
def lending(producer: Any) -> Iterator[None]:
    """The sends made in this context (this thread, this task) use ``producer``, when
    one is given, instead of one taken from the app's pool. A send deferred past the
    context (to a transaction's commit) takes its own."""
    if producer is None:
        yield
        return
    token = _lent.set(producer)
    try:
        yield
    finally:
        _lent.reset(token)


def declare(app: Any, queue: str) -> Any:
    """Register ``queue`` (relier's recovery queue) in ``app``'s queues, of the type of
    the app's own queues, and return it.

    Celery declares a queue on every publish and consume, with the arguments it has for
    it; RabbitMQ refuses a second declaration with other arguments. A name Celery does
    not know is created with ``task_create_missing_queue_type`` on publish but as a
    classic queue by ``select_add`` on consume, so a project of quorum queues
    (``task_default_queue_type = "quorum"``) would see its worker's consume refused.
    Registered here first, by both sides, the recovery queue is declared one way: a
    quorum queue when the app's default or missing queues are quorum, else classic.
    """
    queues = app.amqp.queues
    if queue in queues:  # a dict: `in` never creates a missing queue
        return queues[queue]
    conf = app.conf
    quorum = "quorum" in (conf.task_default_queue_type, conf.task_create_missing_queue_type)
    arguments = {"x-queue-type": "quorum"} if quorum else None
    return queues.add(Queue(queue, routing_key=queue, queue_arguments=arguments))


def send(
    app: Any,
    env: Envelope,
    encoded: str | None = None,
    countdown_s: float = 0.0,
    queue: str | None = None,
) -> None:
    """Publish one incarnation (to ``queue``, default the envelope's). Returns once the
    broker accepted the message (for the Redis transport: once LPUSH returned).
    Raises whatever the transport raises."""
    if queue:
        declare(app, queue)
    with _producing(app) as producer:
        app.send_task(
            env.task,
            args=[encoded if encoded is not None else env.encode()],
            queue=queue or env.queue or None,
            countdown=countdown_s or None,
            producer=producer,
            **_options(env),
        )


def _options(env: Envelope) -> dict[str, Any]:
    # Celery's own argsrepr would be repr(args): the whole envelope a second time in
    # every message. Monitoring (Flower, events) shows the task's arguments instead,
    # cut where Celery cuts its own (argsrepr_maxsize).
    options: dict[str, Any] = {} if env.priority is None else {"priority": env.priority}
    return {
        **options,
        "task_id": env.id,
        "serializer": "json",
        "ignore_result": True,
        "argsrepr": _clip(repr(list(env.args))),
        "kwargsrepr": _clip(repr(dict(env.kwargs))),
        "headers": {MARKER_HEADER: env.fence},
    }


def _clip(text: str, limit: int = 1024) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def send_batch(app: Any, items: Sequence[tuple[Envelope, str]], queue: str) -> bool:
    """Publish several incarnations to ``queue`` through one producer batch
    (kombu's ``Producer.batch``): on the Redis transport, one pipelined round trip
    per batch instead of one per message. Returns True once the broker accepted every
    message; False when this kombu has no batch publishing (nothing was sent).

    Raises whatever the transport raises. Some of the messages may have been delivered
    by then (a transport that cannot batch publishes each at once; a pipeline may fail
    part way), so the caller re-sends them all one by one: a message delivered twice
    carries one fence, and ``start.lua`` starts one fence once.
    """
    declare(app, queue)
    with _producing(app) as producer:
        batch = getattr(producer, "batch", None)
        if batch is None:  # kombu < 5.7
            return False
        with batch(max_size=len(items)):
            for env, encoded in items:
                app.send_task(
                    env.task, args=[encoded], queue=queue, producer=producer, **_options(env)
                )
    return True


@dataclass(frozen=True, slots=True)
class Queued:
    """A message as kombu's Redis transport would queue it: ``LPUSH`` of ``payload``
    onto ``queue_list`` (its full key), and the list's doorbell rung (``bell``)."""

    queue_list: str
    payload: str

    @property
    def bell(self) -> str:
        return redis_channel.bell_of(self.queue_list)

    @property
    def keys(self) -> tuple[str, str]:
        """The list and its doorbell, as a script that queues the message takes them."""
        return self.queue_list, self.bell


def message_for_store(app: Any, env: Envelope, encoded: str, store: Any) -> Queued | None:
    """The broker's list and the message for it, exactly as kombu's Redis transport
    would ``LPUSH`` them, when the broker is that transport on the store's own server
    and database: push.lua then stores and queues the task in one step. Sends nothing.

    None when that does not apply (another transport or server, Sentinel, a unix
    socket, a kombu without batch publishing, a route kombu would not end in one
    ``LPUSH``): the caller publishes with :func:`send`. ``store`` is the store's redis
    client (sync or asyncio).

    The message is built by Celery and kombu themselves: ``send_task`` runs as for any
    publish, with its retry policy and its ``before_task_publish`` and
    ``after_task_publish`` signals, and kombu's batch-publish hook (kombu >= 5.7)
    catches the final command instead of running it. So those signals fire before
    push.lua runs, also for a push it then refuses (an idempotent duplicate, admission
    control, a reused id), whose message is never queued."""
    acquire = getattr(app, "producer_or_acquire", None)
    if acquire is None:  # not a Celery app: nothing to build the message with
        return None
    with _producing(app) as producer:
        batch_state = getattr(producer, "_batch_local", None)
        if batch_state is None or not _same_address(producer.connection, store):
            return None
        capture = _Capture(store)
        batch_state.current = capture
        try:
            app.send_task(
                env.task, args=[encoded], queue=env.queue or None, producer=producer,
                **_options(env),
            )  # fmt: skip
        finally:
            del batch_state.current
    if capture.channel_prefix is None:
        return None
    pushes = [args for name, args in capture.commands if name == "lpush"]
    rings = [args for name, args in capture.commands if name == "zadd"]
    if len(pushes) != 1 or len(pushes) + len(rings) != len(capture.commands):
        return None  # e.g. an expiring queue (PEXPIRE too) or a fanout route
    queue_list, payload = pushes[0]
    if any(args[0] != redis_channel.bell_of(str(queue_list)) for args in rings):
        return None
    # kombu's global_keyprefix is applied by its client when it runs the command.
    return Queued(capture.channel_prefix + str(queue_list), str(payload))


class _Capture:
    """Takes the place of kombu's Redis publish batch (kombu >= 5.7) for one publish:
    it records the commands the transport hands over instead of running them."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.commands: list[tuple[str, tuple[Any, ...]]] = []
        self.channel_prefix: str | None = None  # set once the channel is checked

    def publish(self, channel: Any, message: Any, **kwargs: Any) -> None:
        # Called by kombu inside Celery's publish retry, once the channel exists.
        if not colocated(channel, self.store):
            # Nothing recorded: the caller publishes the usual way, so this one push
            # builds its message twice (and Celery's publish signals fire twice). Only
            # when the URL looked like the store's and the connection is not.
            return
        self.channel_prefix = getattr(channel, "global_keyprefix", "") or ""
        channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, args))


_DEFAULTS = {"host": "localhost", "port": 6379, "path": None, "db": 0, "username": None}


def _same_address(connection: Any, store: Any) -> bool:
    """A first check, from the broker URL alone (no connection is made): kombu's plain
    Redis transport at the store's host, port, database and user."""
    # Sentinel and others: elsewhere. Subclasses may publish differently; these two do not.
    if type(connection.transport) not in (kombu_redis.Transport, redis_channel.Transport):
        return False
    pool = getattr(store, "connection_pool", None)
    if pool is None:  # a Redis Cluster client: kombu cannot use a cluster as a broker
        return False
    ours = pool.connection_kwargs
    if ours.get("path") or not ours.get("host"):  # a unix socket, a Sentinel pool
        return False
    vhost = str(connection.virtual_host or "").strip("/")
    theirs = {
        "host": connection.hostname or "localhost",
        "port": connection.port or 6379,
        "db": int(vhost) if vhost.isdigit() else 0,
        "username": connection.userid or None,
    }
    return all(theirs[f] == ours.get(f, _DEFAULTS[f]) for f in theirs)


def colocated(channel: Any, store: Any) -> bool:
    """The exact check, on a channel kombu publishes or consumes through: its
    connection parameters are the store's (``store``: the store's redis client)."""
    if type(channel) not in (kombu_redis.Channel, redis_channel.Channel):
        return False
    pool = getattr(store, "connection_pool", None)
    if pool is None:  # a Redis Cluster client (see _same_address)
        return False
    theirs = channel.pool.connection_kwargs
    ours = pool.connection_kwargs
    return all(theirs.get(f, d) == ours.get(f, d) for f, d in _DEFAULTS.items())


async def amessage_for_store(app: Any, env: Envelope, encoded: str, store: Any) -> Queued | None:
    """:func:`message_for_store` for async code: off the loop, since taking a producer
    may connect to the broker."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_publisher(), message_for_store, app, env, encoded, store)


def _publisher() -> ThreadPoolExecutor:
    # kombu's publish is blocking. One long-lived pool per process (not the loop's
    # default executor, which each new loop would recreate, threads and all).
    global _executor
    pid = os.getpid()
    if _executor is None or _executor[0] != pid:
        with _lock:
            if _executor is None or _executor[0] != pid:
                _executor = (pid, ThreadPoolExecutor(4, thread_name_prefix="relier-publish"))
    return _executor[1]


async def asend(
    app: Any, env: Envelope, encoded: str | None = None, countdown_s: float = 0.0
) -> None:
    """:func:`send` for async code: the publish runs off the event loop."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(_publisher(), send, app, env, encoded, countdown_s)
