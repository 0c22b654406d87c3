"""Redis clients: one sync client per process, one asyncio client per event loop.

Where they connect: ``config.redis_url`` (``redis://``, ``rediss://`` for TLS,
``unix://``), or, when ``config.sentinels`` is set, whichever server the sentinels
currently name as master of ``config.sentinel_master``. With Sentinel, the URL's host
and port are ignored; its username, password, db and ``ssl_*`` query options still
apply to the master connection, and a ``rediss://`` URL makes the sentinel
connections TLS too. Every relier client (workers, resurrector, producer, admin,
commands, rate limiter, lock) is built here, so the rules hold everywhere; the one
hand-made connection (``pipelined``) takes its address from :func:`connection_options`.

Redis Cluster (``config.cluster``): ``redis_url`` names any node; the clients are
redis-py's ``RedisCluster`` (sync and asyncio), which route each script to the master
of its keys' slot and follow a failover (a moved slot, a promoted replica) within
their retries. Every key one call touches shares a slot (``keys``); the process-wide
connections that are not about a key (the liveness connection, ``CLIENT LIST``) go to
the "home" node: the master of the ``{g}`` slot (:func:`home_client`).

Fork safety: clients are cached per PID, and the cache is emptied in a forked child,
so a prefork child never writes to a socket its parent opened (redis-py's pools also
check the PID; this makes it explicit and covers the Sentinel manager's own sockets).
Async clients are cached per event loop and never cross loops; a forked child keeps
the parent's async clients alive but unused (see ``_after_fork_in_child``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.backoff
import redis.cluster
import redis.connection
import redis.retry
import redis.sentinel

from ..model.config import Config
from ..model.redaction import redact
from . import cluster
from .keys import KeySpace
from .retrying import (
    AsyncBoundedRetry,
    AsyncRetry,
    BoundedRetry,
    Retry,
    backoff,
    retries_within,
)

__all__ = [
    "FastLane",
    "async_client",
    "close_loop_clients",
    "connection_options",
    "describe",
    "fast_lane",
    "redact",
    "sync_client",
]

# Fail-fast clients (the view rate limiter) give up at once: a request must not wait
# seconds for Redis, and a hit must not be counted twice by a retry after a lost reply.
_FAST_TIMEOUT_S = 1.0


_NO_BACKOFF = redis.backoff.NoBackoff()


class _LoopClient:
    __slots__ = ("client", "sentinel")

    def __init__(
        self, client: redis.asyncio.Redis, sentinel: redis.asyncio.sentinel.Sentinel | None
    ) -> None:
        self.client = client
        self.sentinel = sentinel  # closed with the client


# What a cached client is keyed by: everything that decides where and how it connects.
Target = tuple[Any, ...]

_lock = threading.Lock()
_sync: dict[tuple[int, Target, bool, float | None], redis.Redis] = {}
_async: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[Target, bool, float | None], _LoopClient]
] = weakref.WeakKeyDictionary()


def describe(config: Config) -> str:
    """Where ``config``'s clients connect, with passwords hidden: for startup logs."""
    if config.cluster:
        return f"Redis Cluster via {redact(config.redis_url)}"
    if not config.sentinels:
        return redact(config.redis_url)
    return (
        f"master {config.sentinel_master!r} via sentinels {','.join(config.sentinels)} "
        f"({redact(config.redis_url)})"
    )


def target(config: Config) -> Target:
    """What identifies the server(s) a config talks to: the key of every client cache."""
    return (
        config.redis_url, config.sentinels, config.sentinel_master, config.sentinel_password,
        config.cluster,
    )  # fmt: skip


# One process's shared client serves every thread (and an event loop's every task):
# redis-py 8 caps a pool at 100 connections by default, past which a call fails with
# MaxConnectionsError instead of opening one, so a web process with more concurrent
# pushes would fail some. Redis's own maxclients (10,000 by default) is the real bound;
# a URL's ?max_connections= still wins.
MAX_CONNECTIONS = 10_000


def _options(config: Config, fail_fast: bool, wait_s: float | None = None) -> dict[str, Any]:
    timeout = min(config.redis_socket_timeout_s, _FAST_TIMEOUT_S) if fail_fast else None
    if wait_s is not None:  # one connect or read never outlasts the whole budget
        timeout = min(config.redis_socket_timeout_s, wait_s)
    return {
        "decode_responses": True,
        "socket_timeout": timeout or config.redis_socket_timeout_s,
        "socket_connect_timeout": timeout or config.redis_socket_timeout_s,
        "health_check_interval": 30,
        # Names each connection after its process, so CLIENT LIST shows which worker
        # process holds it (and the fork-safety tests can prove who opened it).
        "client_name": f"relier:{os.getpid()}",
        "max_connections": MAX_CONNECTIONS,
    }


def _master_options(config: Config) -> dict[str, Any]:
    """The URL's connection options for a Sentinel-managed master connection.

    Host and port come from the sentinels, so they are dropped; ``rediss://`` becomes
    ``ssl=True``, which makes redis-py pick its Sentinel-managed TLS connection class.
    """
    options: dict[str, Any] = redis.connection.parse_url(config.redis_url)
    for name in ("host", "port", "connection_class"):
        options.pop(name, None)
    if urlsplit(config.redis_url).scheme == "rediss":
        options["ssl"] = True
    return options


def _sentinel_options(config: Config, master: dict[str, Any], retry: Any) -> dict[str, Any]:
    """Connection options for the sentinels themselves.

    Their own password (not the master's), the same timeouts, the same TLS settings as
    the master, and ``retry`` (none): discovery already tries every sentinel in turn,
    and the master connection's retry policy asks them all again.
    """
    options: dict[str, Any] = {
        "socket_timeout": master["socket_timeout"],
        "socket_connect_timeout": master["socket_connect_timeout"],
        "retry": retry,
    }
    if config.sentinel_password:
        options["password"] = config.sentinel_password
    if master.get("ssl"):
        options.update({k: v for k, v in master.items() if k == "ssl" or k.startswith("ssl_")})
    return options


def _sentinel(
    config: Config, options: dict[str, Any], sentinel_cls: Any, retry_cls: Any
) -> tuple[Any, dict[str, Any]]:
    """A Sentinel manager (sync or asyncio, by the classes given) for ``config``, and
    the connection options of the master it finds."""
    master = {**options, **_master_options(config)}  # URL options win, as with from_url
    sentinel_options = _sentinel_options(config, master, retry_cls(_NO_BACKOFF, 0))
    manager = sentinel_cls(config.sentinel_addresses(), sentinel_kwargs=sentinel_options)
    return manager, master


class FastLane:
    """Idle connections of one sync client, for single script calls on hot paths.

    A worker pays three script round trips per task (reservation, start, commit) and a
    producer one; through ``redis.Redis`` each costs about twice the client CPU of the
    bare socket exchange (the pool's checkout with its readiness poll, the retry
    wrapper, the reply callbacks). A lane hands a thread one of its own connections
    (made with the client's pool's class and options: TLS, unix socket, AUTH, db,
    client name) without any of that; a thread that finds none idle makes one.

    Deliberately thin: one attempt, no retries, not even in the connect or the health
    check (the client's retry policy, which the pool's options carry, is replaced), so
    a Redis that is down costs one failed attempt here and then the client's own retry
    budget, not two budgets. A caller that sees a connection error goes through the
    client, which retries; that replays a script whose reply was lost, which is why
    only retrying clients, whose every script is safe to replay, get a lane
    (``ratelimit.lua`` is not, and uses a fail-fast client).
    """

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._connection_class = pool.connection_class
        self._options = {**pool.connection_kwargs, "retry": redis.retry.Retry(_NO_BACKOFF, 0)}
        self._idle: list[redis.connection.AbstractConnection] = []  # LIFO: warm ones first

    def call(self, *command: Any) -> Any:
        """Send ``command`` and return its reply, decoded as the client's would be.

        Raises:
            redis.exceptions.ResponseError: the server's error reply (the connection
                stays usable).
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: the
                exchange failed; the connection is closed, and the command may or may
                not have run.
        """
        try:
            conn = self._idle.pop()  # list.pop and append are atomic: no lock needed
        except IndexError:
            conn = self._connection_class(**self._options)
        try:
            conn.send_packed_command(conn.pack_command(*command))
            reply = conn.read_response()
        except redis.exceptions.ResponseError:
            self._idle.append(conn)  # a whole error reply was read: still in step
            raise
        except BaseException:
            conn.disconnect()  # redis-py has closed it already on socket errors
            raise
        self._idle.append(conn)
        return reply


# Lanes of the retrying, non-Sentinel sync clients (a Sentinel master can move, and its
# connections find it through the pool): keyed by the client object itself.
_lanes: weakref.WeakKeyDictionary[redis.Redis, FastLane] = weakref.WeakKeyDictionary()


def fast_lane(client: redis.Redis) -> FastLane | None:
    """The fast lane of a client :func:`sync_client` built, or None (a fail-fast or
    Sentinel client, or one made elsewhere)."""
    return _lanes.get(client)


def _build_sync(config: Config, fail_fast: bool, wait_s: float | None = None) -> redis.Redis:
    retry = Retry(backoff(), 0 if fail_fast else retries_within(config.redis_retry_s))
    if wait_s is not None and not fail_fast:
        retry = BoundedRetry(wait_s)
    options = _options(config, fail_fast, wait_s)
    if config.cluster:
        return cluster.sync_cluster(config, fail_fast, options)
    if not config.sentinels:
        client = redis.Redis.from_url(config.redis_url, retry=retry, **options)
        if not fail_fast and wait_s is None:
            _lanes[client] = FastLane(client.connection_pool)
        return client
    manager, master = _sentinel(config, options, redis.sentinel.Sentinel, Retry)
    assert config.sentinel_master is not None  # Config refuses sentinels without it
    master_client: redis.Redis = manager.master_for(config.sentinel_master, retry=retry, **master)
    return master_client


def _build_async(
    config: Config, fail_fast: bool, wait_s: float | None = None
) -> tuple[redis.asyncio.Redis, redis.asyncio.sentinel.Sentinel | None]:
    retry = AsyncRetry(backoff(), 0 if fail_fast else retries_within(config.redis_retry_s))
    if wait_s is not None and not fail_fast:
        retry = AsyncBoundedRetry(wait_s)
    options = _options(config, fail_fast, wait_s)
    if config.cluster:
        return cluster.async_cluster(config, fail_fast, options), None
    if not config.sentinels:
        return redis.asyncio.Redis.from_url(config.redis_url, retry=retry, **options), None
    manager, master = _sentinel(config, options, redis.asyncio.sentinel.Sentinel, AsyncRetry)
    assert config.sentinel_master is not None  # Config refuses sentinels without it
    client = manager.master_for(
        config.sentinel_master, redis_class=redis.asyncio.Redis, retry=retry, **master
    )
    return client, manager


_NO_READ_TIMEOUT: dict[str, Any] = {"socket_timeout": None}


def named_client(config: Config, name: str) -> redis.Redis:
    """A client of its own (not the process's shared one) whose connections carry
    ``name`` (``CLIENT SETNAME``, sent again by redis-py on every reconnect) and never
    time a read out: for a connection that waits for nothing, held open so that the
    server sees the process alive (``liveness``). Through Sentinel it follows the
    master like the other clients."""
    retry = Retry(backoff(), retries_within(config.redis_retry_s))
    options = {**_options(config, False), "client_name": name, "health_check_interval": 0}
    if config.cluster:
        host, port = home_address(config)
        return redis.Redis(
            **redis.connection.parse_url(config.redis_url) | {"host": host, "port": port},
            retry=retry, **options | _NO_READ_TIMEOUT,
        )  # fmt: skip
    if not config.sentinels:
        return redis.Redis.from_url(config.redis_url, retry=retry, **options | _NO_READ_TIMEOUT)
    # The sentinels keep the configured timeouts: only the master connection waits.
    manager, master = _sentinel(config, options, redis.sentinel.Sentinel, Retry)
    assert config.sentinel_master is not None  # Config refuses sentinels without it
    named: redis.Redis = manager.master_for(
        config.sentinel_master, retry=retry, **master | _NO_READ_TIMEOUT
    )
    return named


def timed_pipeline(client: Any) -> Any:
    """A non-transactional pipeline whose first reply is the server's TIME, when the
    client can pipeline it: a Redis Cluster client's pipeline refuses a command that
    names no key. Run it with :func:`execute_timed`."""
    pipe = client.pipeline(transaction=False)
    if not isinstance(client, redis.cluster.RedisCluster):
        pipe.time()
    return pipe


def execute_timed(client: Any, pipe: Any) -> tuple[int, list[Any]]:
    """Run a :func:`timed_pipeline`: the server's time (ms) and the other replies. On a
    cluster the time is read just after, in a round trip of its own."""
    replies = list(pipe.execute())
    seconds, micros = (
        client.time() if isinstance(client, redis.cluster.RedisCluster) else (replies.pop(0))
    )
    return int(seconds) * 1000 + int(micros) // 1000, replies


def on_pool(pool: Any) -> redis.Redis:
    """A plain client on a connection pool another library built (kombu's broker
    channel's: its Sentinel, TLS and auth already applied), without that library's own
    command rewriting (kombu's ``global_keyprefix``): the caller passes full keys."""
    return redis.Redis(connection_pool=pool)


def home_address(config: Config) -> tuple[str, int]:
    """On a Redis Cluster, the address of the master that serves the ``{g}`` slot (the
    scanner lease, the holders' set) now: liveness connections are held there and the
    scanners list them there. Asked again after a failover moves it."""
    return cluster.master_of(sync_client(config), KeySpace.of(config).holders)


def master_clients(config: Config, client: Any) -> list[tuple[tuple[str, int], redis.Redis]]:
    """Each master of a Redis Cluster (as ``client``, a cluster client, knows them),
    with a fail-fast plain client of it: for what is asked of every master (its
    durability settings), not of a slot."""
    found = []
    for node in client.get_primaries():
        host, port = str(node.host), int(node.port)
        options = redis.connection.parse_url(config.redis_url) | {"host": host, "port": port}
        master = redis.Redis(**options, retry=Retry(backoff(), 0), **_options(config, True))
        found.append(((host, port), master))
    return found


def refresh_home(config: Config) -> None:
    """On a Redis Cluster, re-read the slot map, so that :func:`home_address` names the
    home master's successor after a failover (a process that made no keyed call since
    would still name the dead one)."""
    if config.cluster:
        cluster.refresh(sync_client(config), config)


# A home master that is gone is not waited for long: its scanner's death check is
# retried at its next turn (0.25 s), on the successor once the slot map is re-read.
_HOME_RETRIES = 2


def home_client(config: Config) -> redis.Redis:
    """A client of the server that holds the liveness connections: the store's own
    client, or on a Redis Cluster a client of its home master (:func:`home_address`),
    for commands about connections rather than keys (``CLIENT LIST``, ``INFO``)."""
    if not config.cluster:
        return sync_client(config)
    host, port = home_address(config)
    key = (os.getpid(), (*target(config), host, port), False, None)
    client = _sync.get(key)
    if client is None:
        with _lock:
            client = _sync.get(key)
            if client is None:
                options = redis.connection.parse_url(config.redis_url) | {
                    "host": host, "port": port
                }  # fmt: skip
                client = _sync[key] = redis.Redis(
                    **options, retry=Retry(backoff(), _HOME_RETRIES), **_options(config, False)
                )
    return client


def sync_client(
    config: Config, *, fail_fast: bool = False, wait_s: float | None = None
) -> redis.Redis:
    """This process's client for ``config``'s Redis (decoded str replies).

    Args:
        config: where to connect (``redis_url``, or ``sentinels`` + ``sentinel_master``).
        fail_fast: no retries and a timeout of at most 1 s, for callers that must
            answer now.
        wait_s: a call retries connection errors for at most this many seconds from
            its first attempt, and no connect or read waits longer (``PUSH_WAIT_S``,
            for a push whose caller is waiting); None: ``REDIS_RETRY_S``'s policy.
            On Redis Cluster only the timeouts are bounded.

    Returns:
        A client shared by every thread of this process; a forked child gets its own.
    """
    key = (os.getpid(), target(config), fail_fast, wait_s)
    client = _sync.get(key)
    if client is None:
        with _lock:
            client = _sync.get(key)
            if client is None:
                client = _sync[key] = _build_sync(config, fail_fast, wait_s)
    return client


def async_client(
    config: Config, *, fail_fast: bool = False, wait_s: float | None = None
) -> redis.asyncio.Redis:
    """The running event loop's client for ``config``'s Redis. Call from inside the loop.

    Args:
        config: where to connect, as for :func:`sync_client`.
        fail_fast: as for :func:`sync_client`.
        wait_s: as for :func:`sync_client`.

    Returns:
        A client whose connections belong to this loop only; another loop, or this one
        in a forked child, gets a client of its own.

    Raises:
        RuntimeError: no event loop is running in this thread.
    """
    loop = asyncio.get_running_loop()
    per_loop = _async.get(loop)
    if per_loop is None:
        _forget_closed_loops()
        per_loop = _async[loop] = {}
    key = (target(config), fail_fast, wait_s)
    entry = per_loop.get(key)
    if entry is None:
        entry = per_loop[key] = _LoopClient(*_build_async(config, fail_fast, wait_s))
    return entry.client


def _forget_closed_loops() -> None:
    # A client's connections keep a reference to their loop, so a loop that was closed
    # without close_loop_clients() (asyncio.run() does that) would stay in the weak
    # dictionary for ever: drop such loops when a new loop first asks for a client.
    for loop in [loop for loop in list(_async.keys()) if loop.is_closed()]:
        _async.pop(loop, None)


# Connections kept per loop elsewhere (``pipelined``) close with the loop's clients.
# They register here, so that this module, which they build on, need not import them.
_loop_closers: list[Callable[[], None]] = []


def on_loop_close(closer: Callable[[], None]) -> None:
    """Have :func:`close_loop_clients` call ``closer`` too (once, however often added)."""
    if closer not in _loop_closers:
        _loop_closers.append(closer)


async def close_loop_clients() -> None:
    """Close the running loop's clients, pipelined connections included (before a
    disposable loop is closed)."""
    for closer in _loop_closers:
        closer()
    per_loop = _async.pop(asyncio.get_running_loop(), {})
    for entry in per_loop.values():
        await entry.client.aclose()
        if entry.sentinel is not None:
            await entry.sentinel.aclose()


async def connection_options(config: Config) -> dict[str, Any]:
    """redis-py connection options (as ``redis.connection.parse_url`` returns them) for a
    connection made by hand, with the current master's host and port under Sentinel.

    For code that opens its own sockets (e.g. a pipelined connection) and must still
    follow a failover: call it again on every reconnect.

    Raises:
        redis.sentinel.MasterNotFoundError: no sentinel names a healthy master.
    """
    options: dict[str, Any] = redis.connection.parse_url(config.redis_url)
    if not config.sentinels:
        return options
    manager, _ = _sentinel(
        config, _options(config, False), redis.asyncio.sentinel.Sentinel, AsyncRetry
    )
    try:
        assert config.sentinel_master is not None
        options["host"], options["port"] = await manager.discover_master(config.sentinel_master)
    finally:
        await manager.aclose()
    return options


# The parent's async clients, kept alive in a forked child for its whole life.
_inherited: list[object] = []


def _after_fork_in_child() -> None:
    global _lock
    # The parent's sockets belong to the parent. Sync clients can simply be dropped:
    # redis-py only shuts a socket down in the process that opened it, so collecting
    # them closes the child's copies of the descriptors and nothing else.
    _sync.clear()
    # Async clients must never be collected here: collecting one closes its asyncio
    # transports, and closing a transport unregisters its socket from the event loop's
    # epoll instance, which the child shares with the parent, so the parent's loop
    # would stop hearing from that socket (a stall until its timeout, then a reconnect).
    _inherited.extend(_async.values())
    _async.clear()
    # A thread of the parent may have held the lock at the instant of the fork; the
    # child has no such thread, so it needs a fresh lock.
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
