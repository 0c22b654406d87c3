"""A TCP proxy in front of a private Redis that loses a script's reply on purpose.

relier promises that every script its retrying clients run is safe to replay: when
Redis runs a script and the reply never arrives, the client (its fast lane, then its
retry policy) runs it again. :class:`LostReplyProxy` makes exactly that fault, for
real: an armed call is forwarded, Redis runs it and its whole reply is read (so the
script certainly ran), and then, instead of the reply, the client gets a closed
connection. The client cannot tell this from a network cut after the write.

Decisions:

* Strictly one command at a time per client connection: the next command is
  forwarded only once the previous reply was handled. Pipelined commands wait in the
  socket buffer meanwhile, so when a reply is dropped nothing the client sent after
  the script reaches Redis: the cut falls exactly after the script. The price is that
  commands that do not get exactly one reply (SUBSCRIBE, MONITOR, CLIENT REPLY
  OFF/SKIP) are not supported; RESP3 push frames are forwarded as they arrive.
* Bytes are forwarded as received, never re-encoded: the proxy cannot change what
  either side sees, except by dropping.
* A thread per client connection, each with its own upstream connection (so
  redis-py's handshake, HELLO/AUTH/SELECT/CLIENT SETINFO, is per connection as it
  would be without the proxy).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import BinaryIO
from urllib.parse import urlsplit, urlunsplit

from relier_django.core.model import config as core_config
from relier_django.core.model.config import Config
from relier_django.core.store import connection

logger = logging.getLogger(__name__)

__all__ = [
    "Arming",
    "Closed",
    "LostReplyProxy",
    "RespStream",
    "config_through",
    "read_command",
    "read_reply",
    "script_sha",
]

# RESP type bytes (RESP2 and RESP3). One-line frames: simple string, error, integer,
# RESP3 null, double, boolean, big number, and "." (end of a streamed aggregate).
_LINE = frozenset(b"+-:_,#(.")
# Length-prefixed: bulk string, RESP3 bulk error and verbatim string.
_BLOB = frozenset(b"$!=")
# Aggregates, by how many frames each counted entry holds: array, set and push hold
# one; map and attribute hold a key and a value.
_AGGREGATE = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2, ord("|"): 2}
_ATTRIBUTE, _PUSH, _END = ord("|"), ord(">"), ord(".")

_BY_SHA = frozenset({b"EVALSHA", b"EVALSHA_RO"})
_BY_SOURCE = frozenset({b"EVAL", b"EVAL_RO"})

# How often the accept loop looks at the stop flag: a listening socket's accept() is
# not reliably woken by close() from another thread on every platform.
_ACCEPT_POLL_S = 0.1


@dataclass
class Arming:
    """One armed drop (what :meth:`LostReplyProxy.drop_reply` returns): ``fired`` once
    the reply it names was dropped."""

    sha: str
    runs_left: int  # runs of the script still to come before the one whose reply goes
    first_key: bytes | None = None  # only runs whose KEYS[1] is this count

    @property
    def fired(self) -> bool:
        return self.runs_left == 0

    def counts(self, sha: str, args: list[bytes]) -> bool:
        if sha != self.sha:
            return False
        # EVALSHA <sha> <numkeys> <KEYS[1]> ...: a run counts if its first key is ours.
        return self.first_key is None or (
            len(args) > 3 and args[2] != b"0" and args[3] == self.first_key
        )


class Closed(Exception):
    """The peer closed the connection (or stop() shut it down) mid-frame or between."""


class RespStream:
    """Buffered reads of one connection (``sock.makefile("rb")``), raising
    :class:`Closed` at end of stream."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file

    def line(self) -> bytes:
        """One line, with its line ending (``\\n`` alone is accepted: inline commands)."""
        line = self.file.readline()
        if not line.endswith(b"\n"):
            raise Closed
        return line

    def exact(self, size: int) -> bytes:
        data = self.file.read(size)
        if len(data) < size:
            raise Closed
        return data


def read_reply(stream: RespStream) -> bytes:
    """One complete reply, nested frames and RESP3 attributes included, as received.

    Raises:
        Closed: the stream ended before the reply did.
        ValueError: not RESP (an unknown type byte or a malformed length).
    """
    out: list[bytes] = []
    _read_frame(stream, out)
    return b"".join(out)


def _read_frame(stream: RespStream, out: list[bytes]) -> int:
    """Append one frame's bytes to ``out``; return its type byte."""
    line = stream.line()
    out.append(line)
    kind, header = line[0], line[1:].rstrip(b"\r\n")
    if kind in _LINE:
        return kind
    if kind in _BLOB:
        if header == b"?":  # RESP3 streamed string: ";len" chunks up to ";0"
            while (size := _chunk_size(stream, out)) > 0:
                out.append(stream.exact(size + 2))
        elif (size := int(header)) >= 0:  # -1: RESP2's null bulk string, no payload
            out.append(stream.exact(size + 2))
        return kind
    if kind in _AGGREGATE:
        if header == b"?":  # RESP3 streamed aggregate: frames up to "."
            while _read_frame(stream, out) != _END:
                pass
        else:
            for _ in range(max(int(header), 0) * _AGGREGATE[kind]):  # -1: null array
                _read_frame(stream, out)
        if kind == _ATTRIBUTE:  # metadata about the reply that follows: part of it
            return _read_frame(stream, out)
        return kind
    raise ValueError(f"not a RESP frame: {line[:40]!r}")


def _chunk_size(stream: RespStream, out: list[bytes]) -> int:
    line = stream.line()
    out.append(line)
    if not line.startswith(b";"):
        raise ValueError(f"not a streamed string chunk: {line[:40]!r}")
    return int(line[1:])


def read_command(stream: RespStream) -> tuple[bytes, list[bytes]]:
    """One client command: its bytes as received, and its arguments.

    Clients send arrays of bulk strings; an inline command (a line of words, as typed
    into telnet) is accepted too. No arguments (a blank line, ``*0``) means Redis will
    not answer, so the caller must neither forward nor wait.

    Raises:
        Closed: the stream ended before the command did.
        ValueError: a malformed array.
    """
    line = stream.line()
    if not line.startswith(b"*"):
        return line, line.split()
    raw, args = [line], []
    for _ in range(int(line[1:])):
        header = stream.line()
        if not header.startswith(b"$"):
            raise ValueError(f"a command argument is not a bulk string: {header[:40]!r}")
        body = stream.exact(int(header[1:]) + 2)
        raw += [header, body]
        args.append(body[:-2])
    return b"".join(raw), args


def script_sha(args: list[bytes]) -> str | None:
    """The SHA-1 of the script a command runs (EVAL, EVALSHA and their ``_RO``
    forms, by source or by name), in lower-case hex; None for any other command."""
    if len(args) < 2:
        return None
    name = args[0].upper()
    if name in _BY_SHA:
        return args[1].decode("ascii", "replace").lower()
    if name in _BY_SOURCE:
        return hashlib.sha1(args[1]).hexdigest()
    return None


def _is_noscript(reply: bytes) -> bool:
    # EVALSHA of a script Redis does not have: it did not run, so it is not counted.
    return reply[:1] in (b"-", b"!") and b"NOSCRIPT" in reply[:64]


class LostReplyProxy:
    """A Redis proxy on 127.0.0.1 that can drop the reply of a chosen script call.

    Usage::

        with LostReplyProxy(redis_server.url) as proxy:
            proxy.drop_reply(script.sha)        # the next run of script loses its reply
            script.run(sync_client(Config(redis_url=proxy.url)), keys, args)
            assert proxy.calls(script.sha) == 2 and proxy.dropped == 1

    Args:
        target_url: the Redis to forward to: ``redis://[user:password@]host:port/db``.
            Credentials and db stay in :attr:`url`; the proxy passes AUTH and SELECT
            through untouched.

    Raises:
        ValueError: ``target_url`` is not a plain ``redis://`` URL (the proxy speaks
            neither TLS nor unix sockets).
    """

    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        if parts.scheme != "redis" or parts.hostname is None:
            raise ValueError(
                "LostReplyProxy forwards to redis://host:port URLs only, not "
                f"{connection.redact(target_url)}"
            )
        self._target_url = parts
        self._target = (parts.hostname, parts.port or 6379)
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._port: int | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._sockets: set[socket.socket] = set()
        self._calls: Counter[str] = Counter()
        self._armed: list[Arming] = []
        self._dropped = 0
        # Malformed frames met (each closed its connection); the fixture asserts none.
        self.protocol_errors: list[ValueError] = []

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> LostReplyProxy:
        """Listen (on a port the kernel picks at bind time, so nothing can take it in
        between, as it could after ``free_port()``) and start accepting."""
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(_ACCEPT_POLL_S)
        self._listener = listener
        self._port = int(listener.getsockname()[1])
        self._acceptor = self._spawn(self._accept_loop, "lostreply-accept")
        return self

    def stop(self) -> None:
        """Close the listener and every connection both ways; join every thread."""
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(10)  # first, so no connection thread starts after this
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            live = list(self._sockets)
            threads = list(self._threads)
        for sock in live:
            _shut(sock)  # wakes the thread blocked reading it
        for thread in threads:
            thread.join(10)

    def __enter__(self) -> LostReplyProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port it listens on (kept after stop(), for messages)."""
        assert self._port is not None, "the proxy is not started"
        return self._port

    @property
    def url(self) -> str:
        """The target's URL with the proxy's address: same credentials, same db."""
        auth = self._target_url.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        return urlunsplit(self._target_url._replace(netloc=netloc))

    # --- arming and counting --------------------------------------------------------

    def drop_reply(self, sha: str, nth: int = 1, first_key: str | None = None) -> Arming:
        """Lose the reply of the ``nth`` run of script ``sha`` from now on, once.

        A run is an EVALSHA/EVALSHA_RO naming ``sha`` or an EVAL/EVAL_RO of a source
        whose SHA-1 is ``sha`` that Redis executed (a NOSCRIPT reply is not a run).
        That call is forwarded and its whole reply read, then the client's connection
        (and its upstream one) is closed without the reply. Several armings may be
        pending; each fires once.

        Args:
            sha: the script's SHA-1 (``LuaScript.sha``), hex.
            nth: 1 for the next run, 2 for the one after, and so on.
            first_key: count only runs whose first key (``KEYS[1]``) is this one: e.g.
                one task's hash, so that of many clients running the script for many
                tasks, the chosen task's run loses its reply.

        Returns:
            The arming; its ``fired`` turns True when the reply is dropped.
        """
        if nth < 1:
            raise ValueError(f"nth must be >= 1, got {nth}")
        arming = Arming(sha.lower(), nth, first_key.encode() if first_key is not None else None)
        with self._lock:
            self._armed.append(arming)
        return arming

    def calls(self, sha: str) -> int:
        """How many times Redis ran script ``sha`` through this proxy (dropped replies
        included)."""
        with self._lock:
            return self._calls[sha.lower()]

    @property
    def dropped(self) -> int:
        """How many replies were dropped so far."""
        with self._lock:
            return self._dropped

    @property
    def armed(self) -> int:
        """How many armings have not fired yet."""
        with self._lock:
            return len(self._armed)

    def _ran(self, sha: str | None, args: list[bytes], reply: bytes) -> bool:
        """Count a script run; True if its reply must be dropped."""
        if sha is None or _is_noscript(reply):
            return False
        with self._lock:
            self._calls[sha] += 1
            fire = False
            for arming in self._armed:
                if arming.counts(sha, args):
                    arming.runs_left -= 1
                    fire = fire or arming.runs_left == 0
            self._armed = [arming for arming in self._armed if arming.runs_left]
            self._dropped += fire
            return fire

    # --- forwarding -----------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> threading.Thread:
        # Daemon threads: a proxy a failed test never stopped cannot hang the run's exit.
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            client.settimeout(None)
            self._spawn(self._serve, "lostreply-conn", client)

    def _serve(self, client: socket.socket) -> None:
        """Relay one client connection, one command at a time, until either side (or
        a dropped reply, or stop()) ends it."""
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(self._forget, client)
            if not self._track(client):
                return
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                return  # Redis is down: the client sees its connection closed
            cleanup.callback(self._forget, upstream)
            if not self._track(upstream):
                return
            for sock in (client, upstream):
                # Small request/reply exchanges: Nagle's delay would add tens of ms.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            from_client, from_redis = (
                RespStream(client.makefile("rb")),
                RespStream(upstream.makefile("rb")),
            )
            cleanup.callback(from_client.file.close)
            cleanup.callback(from_redis.file.close)
            try:
                self._relay(client, upstream, from_client, from_redis)
            except (Closed, OSError):
                pass  # either side hung up, or stop() shut the sockets: the normal end
            except ValueError as exc:
                # Not RESP, or a frame this parser gets wrong: kept for the test to
                # see, since the client only sees a closed connection.
                logger.warning("lostreply: closing a connection on bad RESP: %s", exc)
                with self._lock:
                    self.protocol_errors.append(exc)

    def _relay(
        self,
        client: socket.socket,
        upstream: socket.socket,
        from_client: RespStream,
        from_redis: RespStream,
    ) -> None:
        while True:
            raw, args = read_command(from_client)
            if not args:
                continue  # Redis answers neither a blank line nor an empty array
            upstream.sendall(raw)
            reply = read_reply(from_redis)
            while reply[0] == _PUSH:  # out-of-band RESP3 data, not this command's reply
                client.sendall(reply)
                reply = read_reply(from_redis)
            if self._ran(script_sha(args), args, reply):
                return  # the lost reply: the caller closes both connections
            client.sendall(reply)

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._stopping.is_set():
                return False
            self._sockets.add(sock)
            return True

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        _shut(sock)
        sock.close()


def _shut(sock: socket.socket) -> None:
    # shutdown(), unlike close(), ends the connection at once even while another
    # thread or a makefile() still holds the socket, and wakes a blocked reader.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def config_through(proxy: LostReplyProxy, config: Config | None = None) -> Iterator[Config]:
    """A relier config like ``config`` (default: the current one) whose clients
    connect through ``proxy``, with the production retry policy.

    ``connection`` caches clients by ``redis_url``, so the proxy's URL (its own port)
    gets clients of its own, never one connected to the real server. On exit their
    pooled connections are closed; a later proxy on the same port starts clean.

    Raises:
        ValueError: ``config`` uses Sentinel, which would bypass the proxy.
    """
    base = config if config is not None else core_config.current()
    if base.sentinels:
        raise ValueError("a Sentinel config finds its master through the sentinels, not a URL")
    through = base.replace(redis_url=proxy.url)
    try:
        yield through
    finally:
        for fail_fast in (False, True):
            connection.sync_client(through, fail_fast=fail_fast).connection_pool.disconnect()
