"""What is scheduled, read for operators: the schedule index by due time, and each
periodic entry with its last tick, that tick's outcome and its next tick.

Read-only: paged ``ZRANGE <p>:sched <min> +inf BYSCORE LIMIT`` (of every partition's
index, ``KeySpace.parts``, in one pipelined round trip, merged by due time) and one
pipelined ``HMGET`` per page, never a write, so ``manage.py relier_scheduled`` and the
admin's pages cannot disturb the leader that dispatches these tasks. A listing is a
snapshot: a task dispatched or cancelled between the two reads is left out, not shown
half.

Decision: a page is resumed by a cursor (due time, task id) rather than an offset, as
the DLQ's pages are, so a page costs the same at any depth and stays right while due
tasks leave the head of the index. A filter by task name has no index of its own (one
would widen every push), so it reads at most ``SCAN_LIMIT`` tasks a page and hands
back a cursor where it stopped: a filtered page can hold fewer rows with more to come.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from celery.schedules import crontab

from ..model.config import Config
from ..model.timing import as_utc, unshowable
from ..store.connection import execute_timed, sync_client, timed_pipeline
from ..store.keys import KeySpace
from ..store.receipt import read_status
from .periodic import entry_tick_id, read_entries
from .ticks import Cron, Every, Schedule

MAX_PAGE = 500
"""The most tasks one page may ask for."""
SCAN_LIMIT = 5_000
"""With a task-name filter, the most scheduled tasks one page reads before it stops."""
ARGS_REPR_LIMIT = 200
"""Where :meth:`Scheduled.arguments_repr` clips, in characters."""

_FIELDS = ("state", "name", "queue", "env", "due_ms", "expires_ms", "attempt")
_BATCH = 200  # index members read per round trip


def iso(ms: int) -> str:
    """A Redis-clock time in ms as ISO 8601 UTC with milliseconds (the ``--json`` form);
    a time no date holds (stored before pushes were bounded) as ``timing.unshowable``
    says, so one such task never fails a whole listing."""
    at = as_utc(ms)
    if at is None:
        return unshowable(ms)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page ended: its last task's due time and id. ``str(cursor)`` is the
    opaque form callers hand back; it stays valid after that task left the index."""

    due_ms: int
    task_id: str

    def __str__(self) -> str:
        return f"{self.due_ms}:{self.task_id}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """Raises ValueError for anything a page did not print."""
        due, sep, task_id = text.partition(":")
        if not (sep and due.isdigit() and task_id):
            raise ValueError(f"not a schedule cursor: {text!r} (expected a page's next cursor)")
        return cls(int(due), task_id)


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One task waiting in the schedule index.

    Attributes:
        task_id: the task's id.
        due_ms: when it is due, ms since the epoch (Redis clock).
        task: the task's name.
        queue: the queue it goes to ("" for the task's default).
        state: the task hash's state (``scheduled``; ``queued`` while being dispatched).
        attempt: 1 for a first run, n for the retry after n - 1 failures.
        expires_ms: when it expires (Redis clock, ms), if ``expires=`` was given.
        args, kwargs: the arguments stored; None when the stored envelope is unreadable.
    """

    task_id: str
    due_ms: int
    task: str
    queue: str
    state: str
    attempt: int
    expires_ms: int | None
    args: tuple[Any, ...] | None
    kwargs: Mapping[str, Any] | None

    def arguments_repr(self, limit: int = ARGS_REPR_LIMIT) -> str:
        """``args, key=value`` as Python would write the call, clipped to ``limit``."""
        if self.args is None or self.kwargs is None:
            return "(unreadable envelope)"
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        text = ", ".join(parts)
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def to_json(self) -> dict[str, Any]:
        """The stable ``--json`` form (docs/scheduling.md)."""
        return {
            "task_id": self.task_id,
            "task": self.task,
            "queue": self.queue,
            "due_at": iso(self.due_ms),
            "due_ms": self.due_ms,
            "state": self.state,
            "attempt": self.attempt,
            "expires_at": None if self.expires_ms is None else iso(self.expires_ms),
            "args": None if self.args is None else list(self.args),
            "kwargs": None if self.kwargs is None else dict(self.kwargs),
        }


@dataclass(frozen=True, slots=True)
class Page:
    """One page of the schedule, earliest due first.

    Attributes:
        tasks: the page's tasks.
        next_cursor: where the next page starts; None when this was the last.
        total: how many tasks wait in the schedule index in all (unfiltered).
        now_ms: the Redis clock when the page was read (a due time before it is late).
    """

    tasks: tuple[Scheduled, ...]
    next_cursor: Cursor | None
    total: int
    now_ms: int


def page(
    config: Config,
    cursor: Cursor | None = None,
    limit: int = 50,
    task: str | None = None,
    *,
    client: redis.Redis | None = None,
) -> Page:
    """A page of what is scheduled, earliest due first (ties by task id).

    Args:
        config: relier's config (the key prefix and the Redis to read).
        cursor: the ``next_cursor`` of the previous page; None for the first.
        limit: tasks per page, 1..MAX_PAGE.
        task: only tasks of this name (reads at most ``SCAN_LIMIT`` a page).
        client: a Redis client; the process's sync client by default.

    Returns:
        The page.

    Raises:
        ValueError: ``limit`` outside 1..MAX_PAGE.
        redis.RedisError: Redis cannot be read.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    client = client or sync_client(config)
    keys = KeySpace.of(config)
    parts = keys.parts()
    with timed_pipeline(client) as pipe:
        for p in parts:
            pipe.zcard(p.schedule)
        now_ms, sizes = execute_timed(client, pipe)
    total = sum(int(n) for n in sizes)
    found: list[Scheduled] = []
    at, scanned = cursor, 0
    while len(found) < limit and scanned < SCAN_LIMIT:
        want = limit - len(found) if task is None else min(_BATCH, SCAN_LIMIT - scanned)
        members = _after(client, parts, at, want)
        if not members:
            return Page(tuple(found), None, total, now_ms)
        rows = {row.task_id: row for row in _read(client, keys, members)}
        for task_id, due_ms in members:
            scanned += 1
            at = Cursor(due_ms, task_id)
            row = rows.get(task_id)
            if row is not None and (task is None or row.task == task):
                found.append(row)
                if len(found) == limit:
                    break
    more = at is not None and bool(_after(client, parts, at, 1))
    return Page(tuple(found), at if more else None, total, now_ms)


def _after(
    client: redis.Redis, parts: Sequence[KeySpace], cursor: Cursor | None, count: int
) -> list[tuple[str, int]]:
    """Up to ``count`` (task id, due ms) strictly after ``cursor``, of every partition's
    schedule index, in (due ms, id) order: one index's order, since an id is in one
    partition only. The first ``count`` of all are among the first ``count`` of each.

    Members of one score come in byte order of their ids, so the ones at the cursor's
    own due time that sort at or before its id were on an earlier page. Ids are str
    here: their code point order is their UTF-8 bytes' order."""
    low: int | str = "-inf" if cursor is None else cursor.due_ms
    out: list[tuple[str, int]] = []
    # Each partition still read: (its index, how many members read, how many kept).
    reading = [(p.schedule, 0, 0) for p in parts]
    while reading:  # one round trip for every partition; rarely more than one
        with client.pipeline(transaction=False) as pipe:
            for key, skip, _ in reading:
                pipe.zrangebyscore(key, low, "+inf", start=skip, num=count + 1, withscores=True)
            replies = cast("list[list[tuple[str, float]]]", pipe.execute())
        again = []
        for (key, skip, kept), rows in zip(reading, replies, strict=True):
            for member, score in rows:
                due = int(score)
                if cursor is not None and due == cursor.due_ms and member <= cursor.task_id:
                    continue
                out.append((member, due))
                kept += 1
            if kept < count and len(rows) > count:  # more of this index to read
                again.append((key, skip + len(rows), kept))
        reading = again
    out.sort(key=lambda row: (row[1], row[0]))
    return out[:count]


def _read(
    client: redis.Redis, keys: KeySpace, members: Sequence[tuple[str, int]]
) -> list[Scheduled]:
    with client.pipeline(transaction=False) as pipe:
        for task_id, _ in members:
            pipe.hmget(keys.task(task_id), _FIELDS)
        rows = pipe.execute()
    out = []
    for (task_id, due_ms), row in zip(members, rows, strict=True):
        state, name, queue, env, _, expires, attempt = row
        if state is None:  # dispatched or cancelled between the two reads
            continue
        args, kwargs = _arguments(env)
        # int(float()): a huge time (stored before pushes were bounded) is written by
        # Lua in exponent form ("1e+20"), which int() alone refuses.
        expires_ms = int(float(expires)) if expires else None
        out.append(Scheduled(task_id, due_ms, name or "", queue or "", state,
                             int(attempt or 1), expires_ms, args, kwargs))  # fmt: skip
    return out


def _arguments(env: str | None) -> tuple[tuple[Any, ...] | None, Mapping[str, Any] | None]:
    # Shown, not run: the JSON is read without verifying its checksum or signature
    # (the worker verifies both before anything runs); a body that is no envelope
    # shows as unreadable rather than failing the listing.
    try:
        body = json.loads(env or "")
    except ValueError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    args, kwargs = body.get("args", []), body.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return None, None
    return tuple(args), kwargs


# --- periodic entries -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeriodicEntry:
    """A ``beat_schedule`` entry relier fires, with where it stands.

    Attributes:
        name: the entry's name in ``beat_schedule``.
        task: the task it pushes.
        schedule: the schedule as text (``every 30s``, ``crontab 30 2 * * * Europe/Paris``).
        missed: its missed-tick policy (``all``, ``once``, ``skip``).
        queue: the queue from its options; None for the task's own.
        last_tick_ms: the last tick recorded as handled (Redis clock, ms); None before
            a scanner first saw the entry.
        last_task_id: the task id of that tick (``periodic.tick_id``).
        last_outcome: that task's state as Celery names it (``SUCCESS``, ``FAILURE``,
            ``STARTED``, ``PENDING``, ``RETRY``, ``REVOKED``); None when the store holds
            no record of it: the entry's first sight or a skipped tick (no task was
            pushed), or a result older than ``RESULT_TTL_S``.
        next_tick_ms: its next tick after now (Redis clock, ms).
    """

    name: str
    task: str
    schedule: str
    missed: str
    queue: str | None
    last_tick_ms: int | None
    last_task_id: str | None
    last_outcome: str | None
    next_tick_ms: int

    def to_json(self) -> dict[str, Any]:
        """The stable ``--json`` form (docs/scheduling.md)."""
        last = self.last_tick_ms
        return {
            "name": self.name,
            "task": self.task,
            "schedule": self.schedule,
            "missed": self.missed,
            "queue": self.queue,
            "last_tick_at": None if last is None else iso(last),
            "last_tick_task_id": self.last_task_id,
            "last_tick_outcome": self.last_outcome,
            "next_tick_at": iso(self.next_tick_ms),
        }


@dataclass(frozen=True, slots=True)
class NotFired:
    """An entry of ``beat_schedule`` relier does not fire, and why (``manage.py check``
    reports the same)."""

    name: str
    problem: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "problem": self.problem, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Periodic:
    """Every entry of the app's ``beat_schedule``, read at ``now_ms`` (Redis clock)."""

    entries: tuple[PeriodicEntry, ...]
    not_fired: tuple[NotFired, ...]
    now_ms: int


def periodic(app: Any, config: Config) -> Periodic:
    """The app's periodic entries: each one relier fires with its last tick, that
    tick's outcome and its next tick; the others with why they are not fired.

    Args:
        app: the Celery app whose ``beat_schedule`` is read (its tasks imported).
        config: relier's config (the key prefix and the Redis to read).

    Raises:
        redis.RedisError: Redis cannot be read.
    """
    client = sync_client(config)
    keys = KeySpace.of(config)
    entries, rejected = read_entries(app)
    with timed_pipeline(client) as pipe:
        if entries:
            pipe.hmget(keys.periodic, [e.name for e in entries])
        now_ms, replies = execute_timed(client, pipe)
    lasts = replies[0] if replies else []
    shown = []
    for entry, raw in zip(entries, lasts, strict=True):
        last = None if raw is None else int(raw)
        task_id = None if last is None else entry_tick_id(app, entry, last, keys)
        status = None if task_id is None else read_status(config, task_id)
        outcome = status.state if status is not None and status.known else None
        shown.append(
            PeriodicEntry(
                name=entry.name,
                task=entry.task,
                schedule=schedule_text(entry.schedule),
                missed=entry.missed.value,
                queue=entry.queue,
                last_tick_ms=last,
                last_task_id=task_id,
                last_outcome=outcome,
                next_tick_ms=entry.schedule.next_after(now_ms),
            )
        )
    others = tuple(NotFired(r.entry, r.problem.value, r.detail) for r in rejected)
    return Periodic(tuple(shown), others, now_ms)


_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000))


def schedule_text(schedule: Schedule) -> str:
    """A schedule as an operator reads it: ``every 30s``, ``every 1.5s``,
    ``crontab 30 2 * * * (Europe/Paris)`` (minute hour day-of-month month day-of-week,
    in the app's timezone)."""
    if isinstance(schedule, Every):
        step = schedule.step_ms
        for unit, ms in _UNITS:
            if step % ms == 0:
                return f"every {step // ms}{unit}"
        return f"every {step / 1000:g}s"
    assert isinstance(schedule, Cron)
    c: crontab = schedule.cron
    fields = (c._orig_minute, c._orig_hour, c._orig_day_of_month, c._orig_month_of_year,
              c._orig_day_of_week)  # fmt: skip
    return f"crontab {' '.join(str(f) for f in fields)} ({schedule.tz})"
