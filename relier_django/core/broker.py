"""The only code that hands an envelope to Celery."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .envelope import Envelope

_lock = threading.Lock()
_executor: tuple[int, ThreadPoolExecutor] | None = None


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
    app.send_task(
        env.task,
        args=[encoded if encoded is not None else env.encode()],
        queue=queue or env.queue or None,
        countdown=countdown_s or None,
        **_options(env),
    )


def _options(env: Envelope) -> dict[str, Any]:
    # Celery's own argsrepr would be repr(args): the whole envelope a second time in
    # every message. Monitoring (Flower, events) shows the task's arguments instead,
    # cut where Celery cuts its own (argsrepr_maxsize).
    return {
        "task_id": env.id,
        "serializer": "json",
        "ignore_result": True,
        "argsrepr": _clip(repr(list(env.args))),
        "kwargsrepr": _clip(repr(dict(env.kwargs))),
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
    with app.producer_or_acquire() as producer:
        batch = getattr(producer, "batch", None)
        if batch is None:  # kombu < 5.7
            return False
        with batch(max_size=len(items)):
            for env, encoded in items:
                app.send_task(
                    env.task, args=[encoded], queue=queue, producer=producer, **_options(env)
                )
    return True


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
