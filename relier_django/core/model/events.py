"""Events: what the core tells observers (alerting, Sentry, the Django signals) after
the store confirmed an act.

Six acts are told: a task filed in the DLQ, a task resurrected, a DLQ entry released,
a task cancelled, a task parked over its flow-control limit, and a parked task
dispatched once handed a slot. Each is emitted by the module that owns the act, once the script's
reply said it was done, and once per act: a script call that is replayed after a lost
reply still returns one reply to its caller (docs/architecture.md, G10), so one event.

Handlers run in the process and thread that did the act (a worker's pool process or
event loop thread, the scanner's thread, a web process), in the act's own path: keep
them quick. A handler that raises is logged (logger ``relier_django.events``, with its
traceback) and never breaks the act or the handlers after it: an alerting hook must not
turn a dead-letter into a lost task. The Django layer subscribes one handler that sends
``relier_django.signals``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("relier_django.events")


@dataclass(frozen=True, slots=True)
class TaskDeadLettered:
    """A failure was filed in the DLQ (``dead_letter.lua`` answered "dead-lettered").

    Attributes:
        task_id: the task's id; for a message tied to no task (malformed, a bad
            checksum), the entry id derived from its body.
        task: the task's name; '' when unknown (a message that names none).
        fence: the failing incarnation's fence; None for a message tied to no task.
        reason: the DLQ reason code (``Reason``), e.g. ``exception``.
        error: the failure on one line, as the DLQ lists it ('' when none).
        queue: the queue it was on, '' when unknown.
        entry_id: the DLQ entry's id (the task id for a task).
    """

    task_id: str
    task: str
    fence: int | None
    reason: str
    error: str
    queue: str
    entry_id: str


@dataclass(frozen=True, slots=True)
class TaskResurrected:
    """An expired task was re-published with a new fence and recorded
    (``resurrected.lua`` answered "recorded").

    Attributes:
        task_id: the task's id.
        task: the task's name.
        fence: the new incarnation's fence.
        resurrections: how many times the task has now been resurrected.
        queue: where it was re-published (``RECOVERY_QUEUE``).
        cause: how the previous holder died, as far as is known: ``signal:SIGKILL``,
            ``exit:3``, ``oom`` (a pool process, seen by its worker's main process),
            ``pool_death`` (a pool process, how unknown), ``connection_closed`` (the
            whole worker: its liveness connection closed), ``ttl_expired`` (its
            heartbeat stopped: host or network lost), ``drain``, ``unsent``; ``""``
            when not recorded.
    """

    task_id: str
    task: str
    fence: int
    resurrections: int
    queue: str
    cause: str = ""


@dataclass(frozen=True, slots=True)
class TaskReleased:
    """A DLQ entry was released: its task re-created, published (a task with flow
    control: stored due now for the leader's dispatch through its gate), and the entry
    dropped (``release_done.lua``).

    Attributes:
        task_id: the task's id.
        task: the task's name.
        fence: the new incarnation's fence.
        entry_id: the DLQ entry released.
        reason: the reason code of the failure released.
        queue: the queue it was published to ('' for the task's default).
    """

    task_id: str
    task: str
    fence: int
    entry_id: str
    reason: str
    queue: str


@dataclass(frozen=True, slots=True)
class TaskCancelled:
    """A cancel took effect (``cancel.lua`` answered 1 or 2; a task already finished or
    unknown sends nothing).

    Attributes:
        task_id: the task's id.
        running: True when a running incarnation was fenced off (it will not commit),
            False when the task was removed before it started.
        task: the task's name, '' when the task hash was gone before the cancel read it.
        queue: its queue, '' when unknown or the default.
    """

    task_id: str
    running: bool
    task: str = ""
    queue: str = ""


@dataclass(frozen=True, slots=True)
class TaskParked:
    """A task found no free slot of its limit and waits in its key's line (G14):
    ``push.lua`` parked it at push (told to the pushing process), or the scanner
    leader's ``schedule_take.lua`` did at its dispatch (a countdown, a retry, a release).

    Attributes:
        task_id: the task's id.
        task: the task's name.
        scope: the scope whose slots it waits for (``t:<task>`` or ``n:<limit>``, with
            ``|<key>`` when each key has its own slots).
        key: the line it waits in within a shared scope ('' when the scope is per key).
    """

    task_id: str
    task: str
    scope: str
    key: str = ""


@dataclass(frozen=True, slots=True)
class TaskUnparked:
    """A parked task, handed a freed slot by the script that freed it, was dispatched
    by the scanner leader (``schedule_take.lua`` leased it).

    Attributes:
        task_id: the task's id.
        task: the task's name.
        queue: the queue it is published to ('' for the task's default).
        waited_s: from its parking to this dispatch, seconds (Redis clock).
    """

    task_id: str
    task: str
    queue: str
    waited_s: float


Event = (
    TaskDeadLettered | TaskResurrected | TaskReleased | TaskCancelled | TaskParked | TaskUnparked
)
Handler = Callable[[Event], object]

_lock = threading.Lock()
# Replaced whole on each change, so emit() reads it without the lock.
_handlers: tuple[Handler, ...] = ()


def subscribe(handler: Handler) -> None:
    """Call ``handler(event)`` after each act, in this process. Subscribing the same
    handler again does nothing (like a Django signal's ``dispatch_uid``)."""
    global _handlers
    with _lock:
        if handler not in _handlers:
            _handlers = (*_handlers, handler)


def unsubscribe(handler: Handler) -> bool:
    """Stop calling ``handler``. Returns whether it was subscribed."""
    global _handlers
    with _lock:
        kept = tuple(h for h in _handlers if h != handler)
        found = len(kept) != len(_handlers)
        _handlers = kept
    return found


def emit(event: Event) -> None:
    """Hand ``event`` to every handler, in subscription order. Never raises for a
    handler's ``Exception`` (logged with its traceback); a ``BaseException`` (a worker's
    shutdown, a hard timeout) is not swallowed."""
    for handler in _handlers:
        try:
            handler(event)
        except Exception:
            logger.error(
                "event handler %r failed event=%s task_id=%s",
                handler,
                type(event).__name__,
                event.task_id,
                exc_info=True,
            )
