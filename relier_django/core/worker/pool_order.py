"""A resurrected task runs next on the worker that takes it, ahead of its prefetch.

The transport asks the recovery queue first (``broker/redis_channel.py``), so a
resurrected task is the next message a worker takes. But a prefork worker keeps the
messages it prefetched waiting, in the order received, for one of its pool processes
to be free (the main process's semaphore, one slot per process): a resurrected task
taken by a worker holding 8 prefetched 0.5 s tasks would wait 2 s behind them, as long
again as its dead holder took to be found.

So a message that came from the recovery queue joins the head of that wait instead of
its tail: it starts on the next pool process that becomes free. The other messages
keep their order. A worker without the semaphore (``worker_pool_putlocks = False``,
or a pool that does not use one: threads, solo, gevent) is left as it is; the
recovery queue being asked first still holds.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("relier_django.worker")


def from_recovery(request: Any, recovery_queue: str) -> bool:
    """Whether ``request`` (a Celery worker Request) came from the recovery queue."""
    info = getattr(request, "delivery_info", None) or {}
    return info.get("routing_key") == recovery_queue


def install(controller: Any, recovery_queue: str) -> bool:
    """Make ``controller``'s (Celery's WorkController) wait for a free pool process put
    messages from ``recovery_queue`` first. Idempotent; False when it has no such wait."""
    semaphore = getattr(controller, "semaphore", None)
    waiting = getattr(semaphore, "_waiting", None)
    if semaphore is None or waiting is None or not hasattr(semaphore, "_add_waiter"):
        return False
    if getattr(semaphore, "_relier_front", False):
        return True

    def recovered(entry: tuple[Any, tuple[Any, ...], dict[str, Any]]) -> bool:
        # kombu's LaxBoundedSemaphore queues (callback, args, kwargs); Celery's
        # callback is WorkController._process_task, its one argument the Request.
        _callback, args, _kwargs = entry
        return bool(args) and from_recovery(args[0], recovery_queue)

    def add_waiter(entry: tuple[Any, tuple[Any, ...], dict[str, Any]]) -> None:
        if not recovered(entry):
            waiting.append(entry)
            return
        # Behind the recovered messages already at the head: among themselves they
        # keep the order the resurrector sent them in (interrupted work first).
        at = 0
        while at < len(waiting) and recovered(waiting[at]):
            at += 1
        waiting.insert(at, entry)

    semaphore._add_waiter = add_waiter
    semaphore._relier_front = True
    return True
