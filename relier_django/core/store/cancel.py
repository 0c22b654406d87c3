"""Cancelling a task (``relier_django.cancel``, ``Receipt.cancel``): ``cancel.lua``.

A task that has not started (scheduled, queued, waiting for a resurrection) is removed
at once; a running one is fenced off: its hash goes, so its heartbeat reports it lost
(an ``async def`` task is cancelled then) and its commit is refused. Either way its
outcome is ``cancelled``: a receipt's ``get()`` raises ``TaskCancelled``, Celery's
state is ``REVOKED``, and an idempotency claim it held is freed.
"""

from __future__ import annotations

import uuid
from enum import IntEnum

from ..model import events, outcome
from ..model.config import Config
from . import scripts
from .connection import async_client, sync_client
from .keys import KeySpace


class Cancelled(IntEnum):
    """What :func:`cancel` did."""

    NOTHING = 0  # finished already (its outcome stands), or no such task
    BEFORE_START = 1  # removed before it ran
    WHILE_RUNNING = 2  # its running incarnation is fenced off and will not commit


def _call(config: Config, task_id: str, idem: str | None) -> scripts.ScriptCall[Cancelled]:
    keys, token = KeySpace.of(config), uuid.uuid4().hex
    ttl_ms = int(config.result_ttl_s * 1000)
    return scripts.ScriptCall(
        scripts.CANCEL, keys.for_cancel(task_id, idem or None),
        [task_id, outcome.cancelled(token, running=False), ttl_ms,
         outcome.cancelled(token, running=True)],
        lambda reply: Cancelled(int(reply)),
    )  # fmt: skip


def _told(task_id: str, done: Cancelled, name: object, queue: object) -> Cancelled:
    # Emitted once cancel.lua said it took effect. The name and queue are fixed at push,
    # so the read before the script (which deletes the hash) holds them.
    if done is not Cancelled.NOTHING:
        running = done is Cancelled.WHILE_RUNNING
        events.emit(events.TaskCancelled(task_id, running, str(name or ""), str(queue or "")))
    return done


def cancel(config: Config, task_id: str) -> Cancelled:
    """Cancel ``task_id`` (sync). Safe to repeat: a finished task is left as it is."""
    client = sync_client(config)
    # The claim's key is fixed at push: read first, then one script decides.
    idem, name, queue = client.hmget(KeySpace.of(config).task(task_id), "idem", "name", "queue")
    done = _call(config, task_id, str(idem) if idem else None).run(client)
    return _told(task_id, done, name, queue)


async def acancel(config: Config, task_id: str) -> Cancelled:
    """Async twin of :func:`cancel`."""
    client = async_client(config)
    key = KeySpace.of(config).task(task_id)
    idem, name, queue = await client.hmget(key, "idem", "name", "queue")
    done = await _call(config, task_id, str(idem) if idem else None).arun(client)
    return _told(task_id, done, name, queue)
