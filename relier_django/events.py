"""relier's events for plain functions, without Django's signals (docs/observability-hooks.md)::

    from relier_django import events

    def page(event: events.TaskDeadLettered) -> None: ...

    events.subscribe(page)

Each event is a frozen dataclass, emitted in the process where it happened, once the
script that made it true answered (a task dead-lettered, resurrected, released from
the DLQ, cancelled, parked over its flow-control limit, dispatched once handed a
slot). A handler that raises is logged and never breaks the operation
that emitted the event. Django's signals (``relier_django.signals``) are fed from here.
"""

from .core.model.events import (
    Event,
    Handler,
    TaskCancelled,
    TaskDeadLettered,
    TaskParked,
    TaskReleased,
    TaskResurrected,
    TaskUnparked,
    subscribe,
    unsubscribe,
)

__all__ = [
    "Event",
    "Handler",
    "TaskCancelled",
    "TaskDeadLettered",
    "TaskParked",
    "TaskReleased",
    "TaskResurrected",
    "TaskUnparked",
    "subscribe",
    "unsubscribe",
]
