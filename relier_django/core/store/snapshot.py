"""The one reader of one task: what the store holds of it at one instant, in one round
trip. Every view of a task is a projection of a :class:`Snapshot`:

- where it stands as Celery names it (``receipt.status_of``: ``AsyncResult.state``,
  a receipt's ``status``, a workflow's steps, the periodic listing);
- an unfinished task with its history, for the admin's task page (``observe.task``);
- Django's ``TaskResult`` (``relier_django/tasks/backend.py``).

The keys are the outcome record (result key), the task hash and its history list
while it is unfinished, the trail a committed task keeps when its spec asks
(``keep_trail``: the task hash renamed, with its history), and the DLQ entry of a
dead-lettered one. They share one hash slot (the ``{task_id}`` tag; in a partitioned
store the tag of the task's partition, which holds its DLQ entry too, of the same id),
so one MULTI reads them, on a Redis Cluster as well: a task that commits meanwhile is
seen before or after, never half-gone. A :class:`Reading` says how much to read, so a
receipt polled for its state never fetches an envelope.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from .keys import KeySpace


class Reading(enum.Enum):
    """How much of a task to read."""

    STATE = "state"  # the outcome, the task hash's state and progress, the DLQ's failure
    VIEW = "view"  # an unfinished task's fields and history (no envelope)
    FULL = "full"  # everything: the envelope, the trail, the whole DLQ entry


_STATE_FIELDS = ("state", "attempt", "worker", "fence", "progress")
_VIEW_FIELDS = ("state", "worker", "fence", "name", "queue", "created_ms", "started_ms",
                "due_ms", "expires_ms", "attempt", "res", "progress")  # fmt: skip
_FAILURE_FIELDS = ("reason", "error", "entry", "at_ms")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One task as the store holds it.

    Attributes:
        task_id: the id asked for.
        record: the outcome record (JSON: ``status`` ok / dlq / cancelled), or None.
        fields: the task hash while unfinished (the fields the reading asked for), the
            trail once committed (``FULL``: with ``done_ms`` and ``state`` =
            ``committed``); empty when neither exists.
        history: the incarnation history, oldest event first (``at_ms``, ``event``,
            ``fence``, ``worker``...), from the list, the trail or the DLQ entry
            (``VIEW`` and ``FULL``); an event that is not one is kept as
            ``{"raw": text}``.
        dlq: the DLQ entry's fields (``entry``, ``reason``, ``error``, ``at_ms``...),
            or empty.
    """

    task_id: str
    record: str | None
    fields: dict[str, str]
    history: tuple[dict[str, Any], ...]
    dlq: dict[str, str]

    @property
    def known(self) -> bool:
        return bool(self.record is not None or self.fields or self.dlq)

    @property
    def unfinished(self) -> bool:
        """In flight: its task hash exists (not a trail: a trail says ``committed``)."""
        return bool(self.fields.get("state")) and self.fields.get("state") != "committed"

    @property
    def envelope(self) -> dict[str, Any] | None:
        """The stored envelope as JSON (not verified: it is read to be shown, never
        run), from the task hash, the trail or the DLQ entry (``FULL``)."""
        if self.fields.get("env"):
            found = json.loads(self.fields["env"])
            return found if isinstance(found, dict) else None
        if self.dlq.get("entry"):
            envelope = json.loads(self.dlq["entry"]).get("envelope")
            return envelope if isinstance(envelope, dict) else None
        return None


def _queue(pipe: Any, keys: KeySpace, task_id: str, reading: Reading) -> None:
    pipe.get(keys.result(task_id))
    if reading is Reading.FULL:
        pipe.hgetall(keys.task(task_id))
    else:
        fields = _STATE_FIELDS if reading is Reading.STATE else _VIEW_FIELDS
        pipe.hmget(keys.task(task_id), *fields)
    if reading is not Reading.STATE:
        pipe.lrange(keys.history(task_id), 0, -1)
    if reading is Reading.FULL:
        pipe.hgetall(keys.trail(task_id))
        pipe.hgetall(keys.dlq_entry(task_id))
    elif reading is Reading.STATE:
        pipe.hmget(keys.dlq_entry(task_id), *_FAILURE_FIELDS)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _texts(found: Any) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in dict(found or {}).items()}


def _present(names: Sequence[str], values: Sequence[Any]) -> dict[str, str]:
    return {name: _text(v) for name, v in zip(names, values, strict=True) if v is not None}


def _event(raw: Any) -> dict[str, Any]:
    text = _text(raw)
    try:
        event = json.loads(text)
    except ValueError:
        return {"raw": text}  # shown as recorded rather than dropped
    return event if isinstance(event, dict) else {"raw": text}


def _snapshot(task_id: str, reading: Reading, replies: list[Any]) -> Snapshot:
    record = None if replies[0] is None else _text(replies[0])
    if reading is Reading.STATE:
        fields = _present(_STATE_FIELDS, replies[1])
        return Snapshot(task_id, record, fields, (), _present(_FAILURE_FIELDS, replies[2]))
    if reading is Reading.VIEW:
        fields = _present(_VIEW_FIELDS, replies[1])
        return Snapshot(task_id, record, fields, tuple(_event(e) for e in replies[2]), {})
    live, listed, trail, dlq = _texts(replies[1]), replies[2], _texts(replies[3]), replies[4]
    entry = _texts(dlq)
    if live:
        history: list[Any] = [_event(e) for e in listed]
    elif trail:
        history = json.loads(trail.get("history") or "[]")
    else:
        history = json.loads(entry.get("history") or "[]")
    return Snapshot(task_id, record, live or trail, tuple(history), entry)


def read(
    client: redis.Redis, keys: KeySpace, task_id: str, reading: Reading = Reading.FULL
) -> Snapshot:
    """``task_id`` as the store holds it now (sync): one MULTI."""
    pipe = client.pipeline(transaction=True)
    _queue(pipe, keys, task_id, reading)
    return _snapshot(task_id, reading, pipe.execute())


async def aread(
    client: redis.asyncio.Redis, keys: KeySpace, task_id: str, reading: Reading = Reading.FULL
) -> Snapshot:
    """Async twin of :func:`read`."""
    pipe = client.pipeline(transaction=True)
    _queue(pipe, keys, task_id, reading)
    return _snapshot(task_id, reading, await pipe.execute())
