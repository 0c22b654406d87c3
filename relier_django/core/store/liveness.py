"""A process's liveness connection: how the store learns of a death at once.

Every process that can hold a task (a worker's main process for the messages it
prefetched, each pool process for the task it runs) and every scanner holds one
connection to the store named after it (``CLIENT SETNAME <prefix>|<worker id>``),
subscribed to a channel nobody publishes to, for as long as it lives. When the
process dies, SIGKILL and the OOM killer included, the kernel closes the socket and
the server drops the connection: the scanners see the name leave ``CLIENT LIST``
(``recovery/deaths.py``) within a check, instead of waiting out a heartbeat TTL.

A process that stops on purpose unregisters first (``leave``): only a registered
process is ever declared dead.

The connection never times a read out and is never closed by this side: a slow
network or a pause leaves it open (the TTL covers a frozen process and a lost host).
When the server closes it (a restart, a failover, a client kill), redis-py reconnects
and sends the name and the subscription again; the scanners pause their verdicts
after a server restart or failover (they see a new run id) for long enough.

A process that cannot open it is still covered by its heartbeats: ``hold`` logs and
returns, never raises.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import redis

from ..model.config import Config
from .connection import Target, named_client, refresh_home, target
from .keys import KeySpace

logger = logging.getLogger("relier_django.liveness")

_SEP = "|"  # a worker id holds ':' and '@', never '|'
_RETRY_PAUSE_S = 0.1
# On a Redis Cluster, how often a holder checks that its connection is on the home
# master: well inside the scanners' pause after a failover (deaths.PAUSE_S).
_ROLE_CHECK_S = 1.0


def connection_name(prefix: str, worker: str) -> str:
    """The name a process's liveness connection carries."""
    return f"{prefix}{_SEP}{worker}"


def worker_of(prefix: str, name: str) -> str | None:
    """The worker id a connection name carries, or None for any other connection."""
    head, sep, worker = name.partition(_SEP)
    return worker if sep and head == prefix and worker else None


class _Holder:
    """One named, subscribed connection and the thread that keeps it open."""

    def __init__(self, config: Config, worker: str) -> None:
        self.worker = worker
        self.config = config
        self._open()
        self.thread = threading.Thread(target=self._hold, name="relier-liveness", daemon=True)
        self.thread.start()

    def _open(self) -> None:
        config, keys = self.config, KeySpace.of(self.config)
        self.client = named_client(config, connection_name(config.key_prefix, self.worker))
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        # Connects, names and subscribes now: the caller holds a task only after this.
        pubsub.subscribe(keys.liveness_channel)
        self.pubsub: Any = pubsub  # None while a reopen has failed
        # Then registers: a registered process always had its connection, so a scanner
        # that never listed it (it died within a check of starting) still finds it dead.
        self.client.sadd(keys.holders, self.worker)

    def _hold(self) -> None:
        wait = _ROLE_CHECK_S if self.config.cluster else None
        checked = time.monotonic()
        while True:
            if self.pubsub is None:  # a reopen failed: the server is still away
                time.sleep(_RETRY_PAUSE_S)
                self._reopen()
                continue
            try:
                # Waits on the socket; a connection the server closed is reconnected
                # (name and subscription sent again) by redis-py's retry policy.
                self.pubsub.get_message(timeout=wait)
                if wait is not None and time.monotonic() - checked >= wait:
                    checked = time.monotonic()
                    self._follow_home()
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(_RETRY_PAUSE_S)  # the server is away: try again shortly
                if self.config.cluster:
                    self._reopen()
            except Exception:
                logger.warning("liveness connection worker=%s", self.worker, exc_info=True)
                time.sleep(_RETRY_PAUSE_S)

    def _follow_home(self) -> None:
        # On a Redis Cluster, redis-py reconnects to the address it had: a failed-over
        # home master that came back at once is a replica there now, while the
        # scanners list the connections of its successor and would find this process
        # gone. The node is asked its role (on the holder's other connection: a
        # subscribed one takes no other command); a replica means: move.
        role = self.client.execute_command("ROLE")
        if str(role[0]) != "master":
            logger.info("liveness connection worker=%s follows the home master", self.worker)
            self._reopen()

    def _reopen(self) -> None:
        # On a Redis Cluster the home master may have failed over: its successor is at
        # another address, which only a re-read slot map gives, and a new client uses.
        if self.pubsub is not None:
            self.pubsub.close()
            self.pubsub = None
        try:
            refresh_home(self.config)
            self._open()
        except (redis.RedisError, OSError):
            self.pubsub = None  # _hold tries again after a pause


_held: dict[tuple[Target, str], _Holder] = {}
_lock = threading.Lock()


def hold(config: Config, worker: str) -> bool:
    """Hold this process's liveness connection as ``worker`` (once per process and id;
    later calls cost nothing). False when it could not be opened: the process is then
    covered by its heartbeats alone."""
    key = (target(config), worker)
    if key in _held:
        return True
    with _lock:
        if key in _held:
            return True
        try:
            _held[key] = _Holder(config, worker)
        except (redis.RedisError, OSError):
            logger.warning(
                "liveness connection for worker=%s not opened: its death will be seen by "
                "heartbeat expiry only",
                worker,
                exc_info=True,
            )
            return False
    return True


def leave(config: Config, worker: str) -> None:
    """A process that stops on purpose (a warm shutdown) unregisters first: its
    connection will close, and a scanner must not take that for a death (its reserved
    messages go back to their queues; its running tasks finish or are handed off)."""
    held = _held.get((target(config), worker))
    if held is not None:
        held.client.srem(KeySpace.of(config).holders, worker)


def _after_fork_in_child() -> None:
    global _lock
    # The parent's connections are the parent's: dropped here, redis-py closes only the
    # child's copies of their descriptors (it shuts a socket down only in the process
    # that opened it), so the parent stays connected and the child names its own.
    _held.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
