"""How a worker's main process takes its messages: ``take.lua`` pops the next one and
marks its task held by the worker in the same step (G15: a pop that leaves a trace).

kombu's worker waits on ``BRPOP`` over its queues. When the worker is SIGKILLed with
that command outstanding, Redis can pop the next message into the dead socket: its
task, stored but marked by no one, then waited ``QUEUED_GRACE_S`` (an hour). Taken by
``take.lua`` instead, a relier message leaves its queue only with its task marked held
by the taker and due within one heartbeat TTL: a taker found dead by its closed
connection has that task handed off by the scanner in the same pass as the tasks it
was running (``recovery/deaths.py``), about a second after its death.

The worker's own books (``reservations.py``) then need no round trip of their own for
a message taken this way: its registration happened in the take. What is left to
kombu: the wait itself, on the queues' doorbells (``broker/redis_channel.py``), and every
message that is not relier's, which keeps kombu's own handling.

That applies when the broker is kombu's Redis transport on the store's own server and
database (``publish.colocated``) and the store is not partitioned (the script names the
task's hash from the message). On any other Redis broker (another server or database,
Sentinel) or with a partitioned store, the worker takes with ``take_inflight.lua``
(:class:`InflightIntake`): it keeps a copy of each relier message it takes in its
in-flight record on the broker (``redis_channel.inflight_of``) until it has registered the
message (``reservations.py``, one round trip as before), and drops those copies in its
next take; the scanner that finds it dead puts its copies back in their queues
(``recovery/inflight.py``). RabbitMQ needs neither: it gives a dead consumer's
unacknowledged messages back at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis

from ..broker import publish, redis_channel
from ..broker.marker import MARKER_HEADER
from ..model.config import Config
from ..store import liveness, scripts
from ..store.connection import sync_client
from ..store.keys import KeySpace

logger = logging.getLogger("relier_django.worker")

_takes_here = False  # a channel of this process takes with take.lua


def takes_here() -> bool:
    """Whether this process takes its messages with ``take.lua`` (each relier message
    it receives is already marked held by it)."""
    return _takes_here


class _Taking:
    """A take script sent on a kombu channel's own connection, which kombu reads back
    when the reply arrives: EVALSHA, and the script itself once after Redis lost it
    (a restart, ``SCRIPT FLUSH``)."""

    script: scripts.LuaScript

    def __init__(self) -> None:
        self._load = False

    def _call(self, keys: Sequence[str], args: Sequence[scripts.Arg]) -> list[Any]:
        if self._load:
            return ["EVAL", self.script.source, len(keys), *keys, *args]
        return ["EVALSHA", self.script.sha, len(keys), *keys, *args]

    def taken(self, reply: Any) -> tuple[str, str] | None:
        self._load = False
        if not reply:
            return None
        queue_list, message, mark = reply
        self._marked(int(mark))
        return _text(queue_list), _text(message)

    def _marked(self, mark: int) -> None:
        """What the script kept of this take (its third reply)."""

    def failed(self, error: redis.exceptions.ResponseError) -> bool:
        missing = isinstance(error, redis.exceptions.NoScriptError) or "NOSCRIPT" in str(error)
        self._load = self._load or missing
        return missing


class Intake(_Taking):
    """``take.lua`` for one kombu channel: the command, and its reply read back."""

    script = scripts.TAKE

    def __init__(self, config: Config, worker: str) -> None:
        super().__init__()
        self.keys = KeySpace.of(config)
        self.worker = worker
        self.ttl_ms = int(config.heartbeat_ttl_s * 1000)
        self.before, self.after = self.keys.task_key_parts()

    def command(self, queue_lists: Sequence[str], bells: Sequence[str]) -> list[Any]:
        args: list[scripts.Arg] = [len(queue_lists), self.worker, self.ttl_ms, self.before,
                                   self.after, MARKER_HEADER]  # fmt: skip
        return self._call(self.keys.for_take(queue_lists, bells), args)

    def release(self, client: Any) -> None:
        pass  # nothing kept: every message it took marked its task in the store


class InflightIntake(_Taking):
    """``take_inflight.lua`` for one kombu channel on a Redis broker that is not the
    store: the take keeps a copy of a relier message in the taker's in-flight record,
    dropped at the next take (the message is registered by then: Celery sends
    ``task_received`` while it delivers, before the channel takes again)."""

    script = scripts.TAKE_INFLIGHT

    def __init__(self, worker: str, prefix: str = "") -> None:
        super().__init__()
        self.name = redis_channel.inflight_of(worker)
        self.record = prefix + self.name  # sent as is: kombu's prefixing is not applied
        self._kept: list[int] = []  # copies of messages delivered since the last take

    def command(self, queue_lists: Sequence[str], bells: Sequence[str]) -> list[Any]:
        drop, self._kept = self._kept, []
        args: list[scripts.Arg] = [len(queue_lists), MARKER_HEADER, *drop]
        return self._call([*queue_lists, *bells, self.record], args)

    def _marked(self, mark: int) -> None:
        if mark:
            self._kept.append(mark)

    def release(self, client: Any) -> None:
        # Everything this worker took is put back or registered: its record can go.
        # (kombu's client adds its global_keyprefix to DEL's key: the bare name.)
        client.delete(self.name)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def install(config: Config, worker: str) -> None:
    """Make this worker process take its messages with ``take.lua`` where its broker
    channel is the store's own Redis, else with ``take_inflight.lua``. Opens the
    process's liveness connection first, so that what it takes is always held by a
    process the scanners can find dead. Called in the main process before it consumes
    (``celeryd_after_setup``); a broker that is not kombu's Redis (RabbitMQ) never
    asks for a taker."""
    keys = KeySpace.of(config)
    liveness.hold(config, worker)

    def factory(channel: Any) -> Intake | InflightIntake:
        global _takes_here
        if not keys.tagged and publish.colocated(channel, sync_client(config)):
            _takes_here = True
            return Intake(config, worker)
        logger.info(
            "messages are taken with take_inflight.lua: the broker is not the store's "
            "Redis%s, so a copy of each message stays in this worker's in-flight record "
            "until it is registered", " (the store is partitioned)" if keys.tagged else "",
        )  # fmt: skip
        return InflightIntake(worker, str(getattr(channel, "global_keyprefix", "") or ""))

    redis_channel.use_taker(factory)
