"""Cancelling a task (``relier_django.cancel``, ``Receipt.cancel``): ``cancel.lua``.

A task that has not started (scheduled, queued, waiting for a resurrection) is removed
at once; a running one is fenced off: its hash goes, so its heartbeat reports it lost
(an ``async def`` task is cancelled then) and its commit is refused. Either way its
outcome is ``cancelled``: a receipt's ``get()`` raises ``TaskCancelled``, Celery's
state is ``REVOKED``, and an idempotency claim it held is freed.

A workflow's member that the rest of its workflow depends on (a chain's step with
steps after it, a chord's header member) is filed in the DLQ instead, reason
``cancelled``, its envelope carrying the rest (a chain's later steps; a chord's place,
which holds the callback back): releasing the entry runs it and resumes the workflow,
deleting it ends the workflow where an operator can see it. Removed, it would end its
workflow without a trace (docs/workflows.md).
"""

from __future__ import annotations

import uuid
from enum import IntEnum
from typing import Any

from ..model import events, outcome, workflow
from ..model.config import Config
from ..model.envelope import Envelope, decode
from ..model.errors import EnvelopeError
from ..model.failure import Failure, Reason, entry_json
from ..model.transition import history_tail
from . import scripts
from .connection import async_client, sync_client
from .keys import KeySpace

_READ = ("idem", "name", "queue", "fence", "env")
_TRIES = 5  # a task that gets a new incarnation between each read and each call


class Cancelled(IntEnum):
    """What :func:`cancel` did."""

    NOTHING = 0  # finished already (its outcome stands), or no such task
    BEFORE_START = 1  # removed before it ran (a workflow's member: filed in the DLQ)
    WHILE_RUNNING = 2  # its running incarnation is fenced off and will not commit


_MOVED = -1  # cancel.lua: the task moved on since it was read


def _filing(config: Config, task_id: str, raw_env: Any) -> tuple[str, list[scripts.Arg]]:
    """The fence read, and cancel.lua's last six arguments: the DLQ entry that files a
    workflow's member with the rest of its workflow, or nothing to file."""
    env: Envelope | None = None
    if raw_env:
        try:
            env = decode(str(raw_env), config.signer)
        except EnvelopeError:
            env = None  # unreadable: removed as any task is (its own fence still holds)
    # A step before a group inside its chain opens a chord: the rest depends on it too.
    if env is None or not (env.chain or workflow.holds_a_chord(env)):
        return (str(env.fence) if env else ""), ["", "", "", "", "", ""]
    failure = Failure(
        Reason.CANCELLED, None,
        "cancelled before its workflow could go on: release this entry to run it and resume "
        "the workflow, or delete it to end the workflow here",
    )  # fmt: skip
    tail = history_tail("dead", fence=env.fence, reason=str(Reason.CANCELLED), error=failure.error)
    entry = entry_json(task_id, task_id, failure, env, None, config.signer)
    chord = str(env.chord["id"]) if env.chord else ""
    return str(env.fence), [entry, tail, env.task, env.queue, failure.summary, chord]


def _call(config: Config, task_id: str, read: list[Any]) -> scripts.ScriptCall[int]:
    idem, _name, _queue, _fence, raw_env = read
    fence, filing = _filing(config, task_id, raw_env)
    keys, token = KeySpace.of(config), uuid.uuid4().hex
    ttl_ms = int(config.result_ttl_s * 1000)
    return scripts.ScriptCall(
        scripts.CANCEL, keys.for_cancel(task_id, str(idem) if idem else None),
        [task_id, outcome.cancelled(token, running=False), ttl_ms,
         outcome.cancelled(token, running=True), fence, *filing],
        int,
    )  # fmt: skip


def _told(config: Config, task_id: str, done: int, read: list[Any]) -> Cancelled:
    # Emitted once cancel.lua said it took effect. The name and queue are fixed at push,
    # so the read before the script (which deletes the hash) holds them.
    result = Cancelled(done)
    if result is not Cancelled.NOTHING:
        running = result is Cancelled.WHILE_RUNNING
        name, queue = str(read[1] or ""), str(read[2] or "")
        events.emit(events.TaskCancelled(task_id, running, name, queue))
        if _filing(config, task_id, read[4])[1][0]:
            fence = int(read[3]) if read[3] else None
            summary = "cancelled: the rest of its workflow waits here"
            events.emit(
                events.TaskDeadLettered(task_id, name, fence, "cancelled", summary, queue, task_id)
            )
    return result


def cancel(config: Config, task_id: str) -> Cancelled:
    """Cancel ``task_id`` (sync). Safe to repeat: a finished task is left as it is."""
    client = sync_client(config)
    key = KeySpace.of(config).task(task_id)
    for _ in range(_TRIES):
        # The claim's key and the envelope are fixed per incarnation: read first, then
        # one script decides, refusing if a new incarnation came in between.
        read = client.hmget(key, *_READ)
        done = _call(config, task_id, read).run(client)
        if done != _MOVED:
            return _told(config, task_id, done, read)
    raise RuntimeError(f"task {task_id} kept moving on while it was being cancelled; try again")


async def acancel(config: Config, task_id: str) -> Cancelled:
    """Async twin of :func:`cancel`."""
    client = async_client(config)
    key = KeySpace.of(config).task(task_id)
    for _ in range(_TRIES):
        read = await client.hmget(key, *_READ)
        done = await _call(config, task_id, read).arun(client)
        if done != _MOVED:
            return _told(config, task_id, done, read)
    raise RuntimeError(f"task {task_id} kept moving on while it was being cancelled; try again")
