"""Django signals for what relier did to a task, so alerting and Sentry can hook in.

Each signal is sent once the store confirmed the act (the script's reply said it was
done), once per act, in the process that did it. Every signal is sent with
``sender`` = the event's class (e.g. ``TaskDeadLettered``), ``event`` = that event (a
frozen dataclass from ``relier_django.core.model.events``), and the event's fields as
keyword arguments; take ``**kwargs`` in a receiver, as Django asks, so fields added
later do not break it::

    from django.dispatch import receiver
    from relier_django.signals import task_dead_lettered

    @receiver(task_dead_lettered, dispatch_uid="billing.alert_on_dlq")
    def alert(sender, task_id, task, reason, error, **kwargs):
        sentry_sdk.capture_message(f"{task} {task_id} dead-lettered: {reason}: {error}")

Receivers run in the act's own path (a worker's event loop thread among them): keep
them quick, and connect plain functions (Django cannot run an ``async def`` receiver
from inside the worker's event loop). They are called with ``send_robust``: a receiver
that raises is logged by Django (logger ``django.dispatch``, with its traceback), the
other receivers still run, and the act stands.

Connect receivers in a module every process imports (an ``AppConfig.ready()``): a
signal sent in a worker reaches the worker's receivers, not a web process's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.dispatch import Signal

from .core.model import events

task_dead_lettered = Signal()
"""A task (or a message tied to no task) was filed in the dead-letter queue.

Sent by a worker (the task failed, exhausted its retries, timed out, was addressed to
a task this worker lacks, was not started before its expiry, or its message could not
be read) or by the scanner leader, in a worker's main process or ``manage.py
relier_resurrector`` (past ``max_resurrections``; a stored copy that cannot be read; a
scheduled task expired before its dispatch).

Keyword arguments: ``event`` (``TaskDeadLettered``), ``task_id``, ``task`` ('' when
unknown), ``fence`` (None for a message tied to no task), ``reason`` (the DLQ reason
code, e.g. ``exception``), ``error`` (one line), ``queue``, ``entry_id``. A message tied
to no task that is delivered twice is filed once, but each copy's worker is told it was
filed, so it may be sent once per copy.
"""

task_resurrected = Signal()
"""A task whose worker died or stalled (its heartbeat or queued grace expired) was
re-published with a new fence and recorded.

Sent by the scanner leader: a thread of a worker's main process, or ``manage.py
relier_resurrector``.

Keyword arguments: ``event`` (``TaskResurrected``), ``task_id``, ``task``, ``fence`` (the
new incarnation's), ``resurrections`` (the count so far), ``queue`` (the recovery queue),
``cause`` (how the previous holder died: ``signal:SIGKILL``, ``exit:3``, ``oom``,
``pool_death``, ``connection_closed``, ``ttl_expired``, ``drain``, ``unsent``).
"""

task_released = Signal()
"""A DLQ entry was released: its task re-created with a new fence, published (a task
with flow control: stored due now for the scanner leader to dispatch through its gate),
and the entry dropped.

Sent by the process that released it: a web process (the admin), ``manage.py
relier_dlq release``, or any code calling ``relier_django.dlq.release``.

Keyword arguments: ``event`` (``TaskReleased``), ``task_id``, ``task``, ``fence`` (the new
incarnation's), ``entry_id``, ``reason`` (of the failure released), ``queue``.
"""

task_cancelled = Signal()
"""A cancel took effect: the task was removed before it started, or its running
incarnation was fenced off (it will not commit). Cancelling a finished or unknown task
sends nothing.

Sent by the process that called ``relier_django.cancel``/``acancel`` or
``Receipt.cancel``/``acancel``: usually a web process.

Keyword arguments: ``event`` (``TaskCancelled``), ``task_id``, ``running`` (True when a
running incarnation was fenced off), ``task`` ('' when unknown), ``queue``.
"""

task_parked = Signal()
"""A task over its flow-control limit (G14) found no free slot and waits in its key's
line, in Redis, in no worker (docs/flow-control.md).

Sent by the process that parked it: the pushing process (``push``, ``apush``, a
commit's deferred push, the outbox's relay) for a push due at once, or the scanner
leader (a thread of a worker's main process, or ``manage.py relier_resurrector``) for a
task parked at its dispatch (a countdown, a retry's backoff, a DLQ release). A client
retry of a push whose reply was lost is answered as the first call: sent once.

Keyword arguments: ``event`` (``TaskParked``), ``task_id``, ``task``, ``scope`` (e.g.
``n:stripe`` or ``t:app.sync|acme``), ``key`` (its line in a shared scope, '' per key).
"""

task_unparked = Signal()
"""A parked task was handed a freed slot (by the commit, DLQ filing or cancel that
freed it) and dispatched to the broker.

Sent by the scanner leader as it dispatches the task.

Keyword arguments: ``event`` (``TaskUnparked``), ``task_id``, ``task``, ``queue``,
``waited_s`` (from its parking to its dispatch, on the Redis clock).
"""

_SIGNALS: dict[type[Any], Signal] = {
    events.TaskDeadLettered: task_dead_lettered,
    events.TaskResurrected: task_resurrected,
    events.TaskReleased: task_released,
    events.TaskCancelled: task_cancelled,
    events.TaskParked: task_parked,
    events.TaskUnparked: task_unparked,
}


def _fields(event: events.Event) -> dict[str, Any]:
    return {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}


def send(event: events.Event) -> None:
    """The core's event as its Django signal (the handler ``install`` subscribes)."""
    _SIGNALS[type(event)].send_robust(sender=type(event), event=event, **_fields(event))


def install() -> None:
    """Send the signals from this process's core events; idempotent (``ready()``)."""
    events.subscribe(send)
