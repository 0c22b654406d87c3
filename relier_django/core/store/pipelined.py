"""One pipelined connection per event loop, for small scripts called on a hot path.

redis-py's asyncio client checks a connection out of its pool for every command, so
concurrent callers on one loop each wait for a free socket and for their turn through
its layers: with 8 callers, a sub-millisecond script costs about 0.6 ms p50. Here the
callers share one socket: each call writes its pre-packed command and waits on a
future; replies arrive in order (Redis answers a connection's commands FIFO) and a
protocol callback hands each to the next waiter. The standalone admission check uses
it (``admission.acheck``); see docs/benchmarks.md for the measured difference.

Deliberately small: no retries (a lost reply is reported, never replayed, because a
replay could count one unit twice), EVALSHA with a NOSCRIPT fallback to EVAL, and the
handshake a URL asks for (AUTH, SELECT, TLS, unix sockets).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ssl
import weakref
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
import redis.exceptions

from ..model.config import Config
from .connection import Target, connection_options, describe, on_loop_close, target
from .scripts import Arg, LuaScript


def pack(*parts: Arg) -> bytes:
    """One command in RESP, as Redis reads it."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


@functools.lru_cache(maxsize=256)
def _evalsha(script: LuaScript, keys: tuple[str, ...], args: tuple[Arg, ...]) -> bytes:
    # A hot caller repeats the same call (same counters, same limits): pack it once.
    return pack("EVALSHA", script.sha, len(keys), *keys, *args)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader(encoding="utf-8", replyError=redis.exceptions.ResponseError)
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            waiter = self.waiters.popleft()
            if not waiter.done():  # its caller may have timed out; the reply is still its
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = redis.exceptions.ConnectionError(f"connection to Redis lost: {exc}")
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(self.lost)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        if self.lost is not None or self.transport is None or self.transport.is_closing():
            raise self.lost or redis.exceptions.ConnectionError("connection to Redis closed")
        future = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        self.transport.write(command)
        return future


class PipelinedConnection:
    """A connection whose concurrent calls are pipelined. Use :func:`for_loop`."""

    def __init__(self, protocol: _Protocol, timeout_s: float) -> None:
        self._protocol = protocol
        self._timeout_s = timeout_s

    @property
    def usable(self) -> bool:
        transport = self._protocol.transport
        return self._protocol.lost is None and transport is not None and not transport.is_closing()

    async def call(self, command: bytes) -> Any:
        """Send one packed command and return its reply; an error reply is raised."""
        try:
            async with asyncio.timeout(self._timeout_s):
                reply = await self._protocol.send(command)
        except TimeoutError:
            raise redis.exceptions.TimeoutError("Redis did not answer in time") from None
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return reply

    async def run_script(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        try:
            return await self.call(_evalsha(script, tuple(keys), tuple(args)))
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            # After SCRIPT FLUSH, a restart or a failover: EVAL loads it for next time.
            return await self.call(pack("EVAL", script.source, len(keys), *keys, *args))

    def close(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.transport.close()


# Per loop and target (URL, sentinels): the connection, or the task still opening it
# (so that callers arriving together wait for one connection instead of each opening
# their own).
_per_loop: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[Target, asyncio.Task[PipelinedConnection]]
] = weakref.WeakKeyDictionary()


async def for_loop(config: Config) -> PipelinedConnection:
    """The running loop's pipelined connection to ``config``'s Redis, (re)connected on
    demand. Never shared across loops or processes."""
    loop = asyncio.get_running_loop()
    cached = _per_loop.get(loop)
    if cached is None:
        # A cached task holds its loop, so a loop closed without close_loop() (as
        # asyncio.run() does) would never leave the weak dictionary: drop those now.
        for closed in [other for other in list(_per_loop.keys()) if other.is_closed()]:
            _per_loop.pop(closed, None)
        cached = _per_loop[loop] = {}
    key = target(config)
    opening = cached.get(key)
    if opening is not None and opening.done():
        if not opening.cancelled() and opening.exception() is None and opening.result().usable:
            return opening.result()
        opening = None  # failed or lost: open a new one
    if opening is None:
        opening = cached[key] = asyncio.ensure_future(_connect(config))
    return await asyncio.shield(opening)


async def _connect(config: Config) -> PipelinedConnection:
    # The URL's options, with the current master's address when Sentinel is configured.
    options = await connection_options(config)
    loop = asyncio.get_running_loop()
    timeout = config.redis_socket_timeout_s
    host, port = options.get("host", "127.0.0.1"), options.get("port", 6379)
    tls = _tls(options)
    try:
        async with asyncio.timeout(timeout):
            if "path" in options:
                _, protocol = await loop.create_unix_connection(_Protocol, options["path"])
            else:
                _, protocol = await loop.create_connection(
                    _Protocol, host, port, ssl=tls, server_hostname=host if tls else None
                )
    except (OSError, TimeoutError) as exc:
        raise redis.exceptions.ConnectionError(
            f"cannot connect to {describe(config)}: {exc}"
        ) from exc
    conn = PipelinedConnection(protocol, timeout)
    try:
        if options.get("password"):
            auth = [options["username"]] if options.get("username") else []
            await conn.call(pack("AUTH", *auth, options["password"]))
        if options.get("db"):
            await conn.call(pack("SELECT", options["db"]))
    except BaseException:
        conn.close()
        raise
    return conn


def _tls(options: dict[str, Any]) -> ssl.SSLContext | None:
    if options.get("connection_class") is not redis.connection.SSLConnection:
        return None
    # redis-py's own SSLConnection reads the ssl_* URL options; reuse its context so a
    # rediss:// URL means the same thing here as everywhere else.
    ssl_options = {k: v for k, v in options.items() if k.startswith("ssl_")}
    return redis.asyncio.connection.SSLConnection(**ssl_options).ssl_context.get()


def close_loop() -> None:
    """Close the running loop's pipelined connections (before a disposable loop ends;
    ``connection.close_loop_clients`` calls this too: registered below)."""
    for opening in _per_loop.pop(asyncio.get_running_loop(), {}).values():
        if opening.done() and not opening.cancelled() and opening.exception() is None:
            opening.result().close()
        else:
            opening.cancel()


on_loop_close(close_loop)
