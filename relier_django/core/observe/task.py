"""One in-flight task as the store holds it, with its incarnation history.

The admin's task page reads it (docs/admin-overview.md). The task hash and its history
list share a hash slot (the ``{task_id}`` tag; in a partitioned store the tag of the
task's partition, ``KeySpace.of_task``), so both are read in one MULTI, which a Redis
Cluster accepts: a task that commits meanwhile is seen before or after, never
half-gone. A finished task (committed, dead-lettered, cancelled) has neither key any
more: the reader gets None, and its outcome is the result key's or the DLQ's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from ..store import progress, snapshot
from ..store.keys import KeySpace
from ..store.progress import Progress
from ..store.snapshot import Reading, Snapshot
from .live import as_int, state_name


@dataclass(frozen=True, slots=True)
class TaskView:
    """An unfinished task: its hash's fields and its history, oldest event first.

    Attributes:
        state: as the live view names it (queued, reserved, running, recovering), or
            ``scheduled`` while it waits in the schedule index.
        worker: the worker holding it (reserved, running); ``""`` when none.
        created_ms: when it was pushed, ms since the epoch (Redis clock).
        started_ms: when an incarnation last started (the running one while
            ``running``); None if none has.
        due_ms: when it is (or was) due, for a countdown, an eta or a delayed retry.
        expires_ms: past it, a task not yet started is dead-lettered, never run.
        history: the recorded events (``at_ms``, ``event``, ``fence``, ``worker``...),
            as JSON objects; an event that is not one is kept as ``{"raw": text}``.
        progress: the state and meta it last reported (``ctx.set_progress``,
            ``update_state``), kept through resurrections; None if it reported none.
    """

    task_id: str
    name: str
    queue: str
    state: str
    fence: int
    attempt: int
    resurrections: int
    worker: str
    created_ms: int | None
    started_ms: int | None
    due_ms: int | None
    expires_ms: int | None
    history: tuple[dict[str, Any], ...]
    progress: Progress | None = None  # what it last reported (ctx.set_progress)


def _ms(raw: str) -> int | None:
    return int(raw) if raw.isdigit() else None


def read_task(client: redis.Redis, keys: KeySpace, task_id: str) -> TaskView | None:
    """The task ``task_id`` while it is unfinished.

    Args:
        client: a client on relier's Redis.
        keys: the store's key space.
        task_id: any task id (caller-chosen ids included); it only names keys.

    Returns:
        The task and its history, or None when no unfinished task has this id.
    """
    return view_of(snapshot.read(client, keys, task_id, Reading.VIEW))


def view_of(found: Snapshot) -> TaskView | None:
    """An unfinished task as the admin's task page shows it; None once it finished."""
    f = found.fields
    stored = f.get("state", "")
    if not stored:
        return None
    worker = f.get("worker", "")
    return TaskView(
        task_id=found.task_id,
        name=f.get("name", ""),
        queue=f.get("queue", ""),
        state="scheduled" if stored == "scheduled" else state_name(stored, worker),
        fence=as_int(f.get("fence", "")),
        attempt=as_int(f.get("attempt", ""), 1),
        resurrections=as_int(f.get("res", "")),
        worker=worker,
        created_ms=_ms(f.get("created_ms", "")),
        started_ms=_ms(f.get("started_ms", "")),
        due_ms=_ms(f.get("due_ms", "")),
        expires_ms=_ms(f.get("expires_ms", "")),
        history=found.history,
        progress=progress.load(f.get("progress")),
    )
