"""A dead taker's in-flight copies, put back in their queues (``restore_inflight.lua``).

On a Redis broker that is not the store, a worker takes with ``take_inflight.lua``,
which keeps a copy of each relier message it takes in the worker's in-flight record
until the worker has registered it (``worker/intake.py``). The scanner that finds the
worker dead by its closed connection puts those copies back at the head of their
queues in the same pass as it hands off the worker's tasks, so a message taken in the
instant of a SIGKILL runs about a second later instead of after ``QUEUED_GRACE_S``.
A copy of a task that had already started, or that the pass resurrects, carries an
older or a started fence: ``start.lua`` refuses it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..broker import redis_channel
from ..store import scripts
from ..store.connection import on_pool

logger = logging.getLogger("relier_django.resurrector")


def restore(app: Any, workers: Iterable[str]) -> int:
    """Put back the in-flight copies of each dead worker in ``workers``, on ``app``'s
    broker when it is a Redis one (none on RabbitMQ: the broker does it). Returns how
    many messages went back. Safe to repeat: a record restored once answers the same.

    Raises:
        redis.RedisError, OSError: the broker could not be reached (the copies stay, and
            the next death check of a scanner that remembers the workers tries again).
    """
    names = list(workers)
    if not names or app is None:
        return 0
    with app.connection_for_write() as connection:
        if getattr(connection.transport, "driver_type", "") != "redis":
            return 0
        channel = connection.default_channel
        prefix = str(getattr(channel, "global_keyprefix", "") or "")
        # kombu's client prefixes some commands' keys and not others: a plain client on
        # its pool, given the full key.
        client = on_pool(channel.client.connection_pool)
        put = 0
        for worker in names:
            call = scripts.ScriptCall(
                scripts.RESTORE_INFLIGHT, [prefix + redis_channel.inflight_of(worker)],
                [scripts.REPLAY_WINDOW_MS], int,
            )  # fmt: skip
            put += call.run(client)
    if put:
        logger.warning("put %s message(s) taken by dead worker(s) back in their queues", put)
    return put
