"""``manage.py relier_scheduled``: what waits in the schedule, and the periodic entries.

``list`` shows the tasks waiting for their due time (countdown, eta, a retry's
backoff), earliest first, by pages; ``periodic`` shows each ``beat_schedule`` entry
relier fires with its last tick, that tick's outcome and its next tick. Reads go
through ``relier_django.readers.scheduled`` (what the admin pages read too); this module parses
arguments and renders. The ``--json`` forms are stable, documented in
docs/scheduling.md.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from relier_django import conf
from relier_django.readers import scheduled
from relier_django.readers.render import plural, utc_text


def _limit(text: str) -> int:
    """argparse type of --limit: an integer in 1..MAX_PAGE."""
    if not text.strip().isdigit() or not 1 <= int(text) <= scheduled.MAX_PAGE:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {scheduled.MAX_PAGE}")
    return int(text)


def _cursor(text: str) -> scheduled.Cursor:
    """argparse type of --cursor: the ``next page`` value a previous listing printed."""
    try:
        return scheduled.Cursor.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]


def _json_flag(parser: Any) -> Any:
    parser.add_argument("--json", action="store_true", dest="as_json", help="one JSON object")
    return parser


class Command(BaseCommand):
    help = (
        "Show what is scheduled: 'list' the tasks waiting for their due time, earliest "
        "first; 'periodic' the beat_schedule entries relier fires, with their last and "
        "next ticks. Run 'relier_scheduled <subcommand> --help' for options."
    )

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        p = _json_flag(sub.add_parser("list", help="scheduled tasks, earliest due first"))
        p.add_argument("--task", metavar="NAME", help="only tasks of this name")
        p.add_argument("--limit", type=_limit, default=50, metavar="N", help="default 50")
        p.add_argument("--cursor", type=_cursor, help="continue where a previous page ended")
        _json_flag(sub.add_parser("periodic", help="periodic entries: last tick, next tick"))

    def handle(self, *args: Any, subcommand: str, **options: Any) -> None:
        runs: dict[str, Callable[..., None]] = {"list": self._list, "periodic": self._periodic}
        try:
            runs[subcommand](**options)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            where = conf.redis_location()
            raise CommandError(f"cannot reach Redis at {where}: {exc}") from exc
        except RedisError as exc:
            raise CommandError(f"Redis at {conf.redis_location()} failed: {exc}") from exc

    def _json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, ensure_ascii=False))

    def _list(
        self, *, task: str | None, limit: int, cursor: scheduled.Cursor | None, as_json: bool,
        **_: Any,
    ) -> None:  # fmt: skip
        page = scheduled.page(cursor, limit, task)
        nxt = None if page.next_cursor is None else str(page.next_cursor)
        if as_json:
            tasks = [t.to_json() for t in page.tasks]
            now = scheduled.iso(page.now_ms)
            self._json({"now": now, "total": page.total, "tasks": tasks, "next_cursor": nxt})
            return
        if not page.tasks:
            self.stdout.write("Nothing is scheduled." if page.total == 0 else "No task matches.")
        else:
            rows = [
                (utc_text(t.due_ms), t.task_id, t.task, t.queue or "(default)",
                 t.arguments_repr())
                for t in page.tasks
            ]  # fmt: skip
            headers = ("DUE (UTC)", "TASK ID", "TASK", "QUEUE", "ARGUMENTS")
            for line in _table(headers, rows):
                self.stdout.write(line)
            total = plural(page.total, "task", "tasks")
            self.stdout.write(f"\n{len(page.tasks)} shown; {total} scheduled in all")
        if nxt is not None:
            self.stdout.write(f"next page: --cursor {nxt}")

    def _periodic(self, *, as_json: bool, **_: Any) -> None:
        view = scheduled.periodic()
        if as_json:
            self._json({
                "now": scheduled.iso(view.now_ms),
                "entries": [e.to_json() for e in view.entries],
                "not_fired": [n.to_json() for n in view.not_fired],
            })  # fmt: skip
            return
        if not view.entries:
            self.stdout.write("No periodic entry names an @rl_task.")
        else:
            rows = [
                (e.name, e.task, e.schedule, e.missed,
                 "-" if e.last_tick_ms is None else utc_text(e.last_tick_ms),
                 e.last_outcome or "-", utc_text(e.next_tick_ms))
                for e in view.entries
            ]  # fmt: skip
            headers = ("ENTRY", "TASK", "SCHEDULE", "MISSED", "LAST TICK (UTC)", "OUTCOME",
                       "NEXT TICK (UTC)")  # fmt: skip
            for line in _table(headers, rows):
                self.stdout.write(line)
        if view.not_fired:
            self.stdout.write("\nNot fired by relier:")
            for n in view.not_fired:
                self.stdout.write(f"  {n.name}: {n.detail} ({n.problem})")
