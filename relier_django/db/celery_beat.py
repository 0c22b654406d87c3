"""django-celery-beat's periodic tasks, fired by relier (``RELIER["CELERY_BEAT_MODELS"]``).

Its enabled ``PeriodicTask`` rows that name an ``@rl_task`` become periodic entries
beside ``beat_schedule``, fired by the scanners (the leader on time) through the same
exactly-once claims (docs/scheduling.md). Its admin keeps working: a row added, edited,
disabled or deleted there takes effect at the next pass.

- One cheap query per pass: django-celery-beat moves ``PeriodicTasks.last_update`` at
  every save and delete made through the ORM; the rows are read again only when it
  moved (a bulk ``update()`` does not move it: call ``PeriodicTasks.update_changed()``).
- The scanner never depends on the database: when a read fails, the last rows read are
  kept and fired, and the failure is logged once (WARNING) until a read succeeds.
- A row's last change (``date_changed``, or its ``start_time`` if later) becomes the
  entry's ``relier_since_ms``: an edited or re-enabled row starts at its next tick and
  never catches up ticks from before the change.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import close_old_connections
from django.utils import timezone

from .. import conf
from ..core.schedule import periodic

logger = logging.getLogger("relier_django.periodic")

WHERE = "django-celery-beat"
"""The source's name in logs and checks."""


@dataclass(frozen=True, slots=True)
class _Row:
    name: str
    raw: dict[str, Any]
    expires: datetime | None


class ModelSource:
    """A :data:`periodic.Source` reading django-celery-beat's tables; safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamp: datetime | None = None
        self._rows: list[_Row] | None = None
        self._failing: str | None = None

    def __call__(self) -> dict[str, Any]:
        if not conf.get_django_settings().celery_beat_models:
            return {}
        with self._lock:
            self._refresh()
            rows = self._rows
        if rows is None:
            return {}
        now = timezone.now()
        # An expired row fires no more ticks, as under django-celery-beat's own beat.
        return {r.name: r.raw for r in rows if r.expires is None or r.expires > now}

    def forget(self) -> None:
        """Drop the rows read: the next call reads the tables again."""
        with self._lock:
            self._stamp, self._rows, self._failing = None, None, None

    def _refresh(self) -> None:
        try:
            # A connection the database dropped (a restart) is replaced, not reused.
            close_old_connections()
            stamp = _last_change()
            if self._rows is None or stamp is None or stamp != self._stamp:
                self._rows = _read_rows()
                self._stamp = stamp
        except Exception as exc:
            close_old_connections()
            seen = f"{type(exc).__name__}: {exc}"
            if self._failing != seen:
                self._failing = seen
                kept = "no rows were read yet: none is fired"
                if self._rows is not None:
                    kept = f"the last {len(self._rows)} row(s) read are fired meanwhile"
                logger.warning(
                    "periodic source=%s: reading the database failed (%s); %s, and the "
                    "read is retried at every pass (logged once while it fails)",
                    WHERE, seen, kept,
                )  # fmt: skip
            return
        if self._failing is not None:
            self._failing = None
            logger.warning("periodic source=%s: the database is read again", WHERE)


def _last_change() -> datetime | None:
    from django_celery_beat.models import PeriodicTasks

    stamp = PeriodicTasks.last_change()
    return stamp if isinstance(stamp, datetime) else None


def _read_rows() -> list[_Row]:
    from django_celery_beat.models import PeriodicTask

    rows = PeriodicTask.objects.filter(enabled=True).select_related(
        "interval", "crontab", "solar", "clocked"
    )
    return [_row(task) for task in rows]


def _row(task: Any) -> _Row:
    """A row as a ``beat_schedule`` entry; what relier cannot fire is left for the core
    to reject with its reason (the checks and the scanner's log name it)."""
    options: dict[str, Any] = {}
    if task.queue:
        options["queue"] = task.queue
    since = task.date_changed
    if task.start_time is not None and (since is None or task.start_time > since):
        since = task.start_time
    if since is not None:
        options[periodic.SINCE_OPTION] = int(since.timestamp() * 1000)
    try:
        schedule = task.schedule
    except Exception as exc:  # a row with no schedule set (its admin form requires one)
        schedule = f"no schedule ({type(exc).__name__})"
    return _Row(
        str(task.name),
        {
            "task": task.task,
            "schedule": schedule,
            "args": _json(task.args, []),
            "kwargs": _json(task.kwargs, {}),
            "options": options,
            "one_off": bool(task.one_off),
        },
        task.expires,
    )


def _json(text: Any, empty: Any) -> Any:
    """A JSON field's value; its text as it is when it does not parse (rejected then)."""
    if not text:
        return empty
    try:
        return json.loads(text)
    except ValueError:
        return text


source = ModelSource()
"""The one source this process fires from (``install`` adds it)."""


def install() -> None:
    """Add the source to the scanner's; it reads nothing while the setting is off."""
    periodic.add_source(WHERE, source)
