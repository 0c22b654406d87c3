"""Everything the store holds of one task, unfinished or finished, in one round trip.

What ``django.tasks``' ``TaskResult`` is built from (``relier_django/tasks.py``): the
outcome record (result key), the task hash and its history while it is unfinished, the
trail a committed task keeps when its spec asks (``keep_trail``: the task hash renamed,
with its history), and the DLQ entry of a dead-lettered one. Every key shares one hash
slot (the ``{task_id}`` tag; in a partitioned store the tag of the task's partition,
which holds its DLQ entry too, of the same id), so one MULTI reads them all, on a Redis
Cluster as well: a task that commits meanwhile is seen before or after, never half-gone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from .keys import KeySpace


@dataclass(frozen=True, slots=True)
class Story:
    """One task as the store holds it.

    Attributes:
        task_id: the id asked for.
        record: the outcome record (JSON: ``status`` ok / dlq / cancelled), or None.
        fields: the task hash while unfinished, the trail once committed (with
            ``done_ms`` and ``state`` = ``committed``); empty when neither exists.
        history: the incarnation history, oldest event first (``at_ms``, ``event``,
            ``fence``, ``worker``...), from the list, the trail or the DLQ entry.
        dlq: the DLQ entry's fields (``entry``, ``reason``, ``at_ms``...), or empty.
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
    def envelope(self) -> dict[str, Any] | None:
        """The stored envelope as JSON (not verified: it is read to be shown, never
        run), from the task hash, the trail or the DLQ entry."""
        if self.fields.get("env"):
            found = json.loads(self.fields["env"])
            return found if isinstance(found, dict) else None
        if self.dlq.get("entry"):
            envelope = json.loads(self.dlq["entry"]).get("envelope")
            return envelope if isinstance(envelope, dict) else None
        return None


def _queue(pipe: Any, keys: KeySpace, task_id: str) -> None:
    pipe.get(keys.result(task_id))
    pipe.hgetall(keys.task(task_id))
    pipe.lrange(keys.history(task_id), 0, -1)
    pipe.hgetall(keys.trail(task_id))
    pipe.hgetall(keys.dlq_entry(task_id))


def _story(task_id: str, replies: list[Any]) -> Story:
    record, live, listed, trail, dlq = replies
    fields = dict(live or trail or {})
    if live:
        history = [json.loads(e) for e in listed]
    elif trail:
        history = json.loads(trail.get("history") or "[]")
    else:
        history = json.loads((dlq or {}).get("history") or "[]")
    return Story(task_id, record, fields, tuple(history), dict(dlq or {}))


def read(client: redis.Redis, keys: KeySpace, task_id: str) -> Story:
    """``task_id``'s story (sync)."""
    pipe = client.pipeline(transaction=True)
    _queue(pipe, keys, task_id)
    return _story(task_id, pipe.execute())


async def aread(client: redis.asyncio.Redis, keys: KeySpace, task_id: str) -> Story:
    """Async twin of :func:`read`."""
    pipe = client.pipeline(transaction=True)
    _queue(pipe, keys, task_id)
    return _story(task_id, await pipe.execute())
