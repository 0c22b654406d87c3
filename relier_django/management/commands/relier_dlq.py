"""``manage.py relier_dlq``: list, inspect, release, delete, purge, export the DLQ.

Everything goes through ``relier_django.dlq`` (the store and release the admin uses
too); this module parses arguments and renders results. The ``--json`` forms are
stable contracts, documented in docs/dlq-command.md.

An entry id is its task's id, so a task released from the DLQ that fails again is
back under the same id, holding a newer failure (a higher fence). ``release`` and
``delete`` therefore act on one failure, never on "whatever is there": the one
``--fence N`` names (the FENCE the listing showed the operator), or else the one the
command reads just before acting, which it prints. Either way the fence goes to the
atomic script, so a failure that lands in between is left alone, as the admin's
pinned selections are.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from relier_django import conf, dlq
from relier_django.readers import tasks
from relier_django.readers.render import HISTORY_COLUMNS, history_rows, plural, utc_text

_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+)([smhdw])")
_WIDTH = 100  # the listing's line width on a terminal of unknown width, in columns
_MIN_ERROR = 24  # below this the error column is useless: let the line run long instead


@dataclass(frozen=True, slots=True)
class When:
    """A moment given on the command line: ``ago_ms`` before now, or at ``at_ms``."""

    ago_ms: int | None = None
    at_ms: int | None = None

    def ms(self, store: dlq.DeadLetterStore) -> int:
        """The moment in ms since the epoch, on the Redis clock.

        "2h ago" is measured on the Redis clock, the clock every failure time is on,
        so a skewed operator machine still selects the entries it means.
        """
        at = self.at_ms if self.at_ms is not None else store.server_time_ms() - (self.ago_ms or 0)
        return max(at, 0)  # the DLQ's time indexes start at the epoch


def _when(text: str) -> When:
    """argparse type: a duration ago (``30s 15m 2h 7d 1w``) or an ISO 8601 date/datetime."""
    if match := _DURATION.fullmatch(text.strip()):
        return When(ago_ms=int(match[1]) * _UNIT_MS[match[2]])
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (30s, 15m, 2h, 7d, 1w) nor an ISO 8601 date "
            "or datetime (2024-05-01, 2024-05-01T12:00:00Z)"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)  # every DLQ time is UTC, so a naive time is too
    return When(at_ms=int(at.timestamp() * 1000))


def _limit(text: str) -> int:
    """argparse type of --limit: an integer in 1..MAX_PAGE."""
    if not text.strip().isdigit() or not 1 <= int(text) <= dlq.MAX_PAGE:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {dlq.MAX_PAGE}")
    return int(text)


def _cursor(text: str) -> dlq.Cursor:
    """argparse type of --cursor: the ``next page`` value a previous listing printed."""
    try:
        return dlq.Cursor.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fence(text: str) -> int:
    """argparse type of --fence: a fence as ``list`` and ``inspect`` print it."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a fence: give the FENCE a listing showed"
        )
    return int(text)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Collection[int] = (),
    fit: int = 0,
) -> list[str]:
    """Aligned columns; the columns in ``right`` are right-aligned, and with ``fit`` the
    last column is cut so that lines stay within ``fit`` columns."""
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    last = widths[-1]
    if fit:
        last = max(fit - sum(widths[:-1]) - 2 * (len(widths) - 1), _MIN_ERROR)
    lines = []
    for row in (headers, *rows):
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        if fit:
            cells[-1] = _cut(row[-1], last)
        lines.append("  ".join(cells).rstrip())
    return lines


def _filters(parser: Any) -> Any:
    parser.add_argument("--task", metavar="NAME", help="only this task name")
    parser.add_argument("--reason", choices=[str(r) for r in dlq.Reason], metavar="CODE",
                        help="only this reason: " + ", ".join(dlq.Reason))  # fmt: skip
    parser.add_argument("--since", type=_when, metavar="WHEN", help="e.g. 2h or 2024-05-01")
    return parser


def _fence_flag(parser: Any) -> Any:
    parser.add_argument("--fence", type=_fence, metavar="N",
                        help="act only if ID still holds the failure at fence N (the listed "
                             "FENCE); default: the failure read just before acting")  # fmt: skip
    return parser


def _json_flag(parser: Any) -> Any:
    parser.add_argument("--json", action="store_true", dest="as_json", help="one JSON object")
    return parser


def _query(
    store: dlq.DeadLetterStore, task: str | None, reason: str | None, since: When | None
) -> dlq.Query:
    return dlq.Query(task, reason, None if since is None else since.ms(store))


def _jsonl(entry: dlq.Entry) -> str:
    return json.dumps(entry.to_json(), ensure_ascii=False)


def _failure(summary: dlq.Summary) -> str:
    """Which failure of an entry an action took: its fence and time, as the listing shows."""
    fence = "-" if summary.fence is None else summary.fence
    return f"fence {fence}, failed {utc_text(summary.failed_at_ms)} UTC"


def _not_that_failure(pinned: int, holds: int | None) -> str:
    """Why an entry pinned to failure ``pinned`` was left alone: it holds ``holds`` now."""
    if holds is None:
        return "it is a message not tied to a task, which has no fence: leave out --fence"
    return (
        f"it holds the failure at fence {holds} now, not fence {pinned} (it was released "
        f"and failed again since); inspect it, then pass --fence {holds} to act on that one"
    )


def _release_one(
    store: dlq.DeadLetterStore, entry_id: str, fence: int | None
) -> tuple[dlq.Summary, str]:
    """Release the failure ``fence`` names, or else the one read here; returns that
    failure's summary and the new incarnation's task id.

    Raises:
        EntryNotReleasable: as ``core.release.release``, or the entry holds another
            failure than ``fence``.
    """
    entry = store.get(entry_id)
    if entry is None:
        raise dlq.EntryNotReleasable(entry_id, "no such entry in the dead-letter queue")
    if fence is not None and entry.fence != fence:
        raise dlq.EntryNotReleasable(entry_id, _not_that_failure(fence, entry.fence))
    # Pinned to the failure just read: one that lands before release.lua runs stays.
    return entry.summary, dlq.release_entry(entry_id, expected_fence=entry.fence).task_id


def _outcome(
    entry_id: str, *, why: str | None = None, task_id: str | None = None
) -> dict[str, Any]:
    """One entry of ``release --json``: released as ``task_id``, refused for ``why``,
    or neither (a dry run's match). A released task's state and fence are read just
    after its release, so a worker may already have taken it, or finished it."""
    task = None if task_id is None else tasks.unfinished(task_id)
    state = None if task_id is None else "finished" if task is None else task.state
    return {
        "id": entry_id, "released": task_id is not None, "why": why, "task_id": task_id,
        "state": state, "fence": None if task is None else task.fence,
    }  # fmt: skip


def _one_pin(entry_ids: Sequence[str], fence: int | None) -> list[str]:
    """The ids named, each once; ``--fence`` pins exactly one of them."""
    wanted = list(dict.fromkeys(entry_ids))
    if fence is not None and len(wanted) != 1:
        raise CommandError("--fence pins one failure: give exactly one ID with it", returncode=2)
    return wanted


class Command(BaseCommand):
    help = (
        "Inspect and act on the dead-letter queue: list, inspect, release, delete, purge, "
        "export, stats. Run 'relier_dlq <subcommand> --help' for each one's options."
    )

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        p = _json_flag(sub.add_parser("list", help="entries, newest failure first, by pages"))
        _filters(p)
        p.add_argument("--limit", type=_limit, default=50, metavar="N", help="default 50")
        p.add_argument("--cursor", type=_cursor, help="continue where a previous page ended")
        p.add_argument("--wide", action="store_true", help="never cut the error to fit")
        p = _json_flag(sub.add_parser("inspect", help="one entry: traceback, envelope, history"))
        p.add_argument("entry_id", metavar="ID")
        p = _filters(sub.add_parser("release", help="run entries' tasks again, once each"))
        _json_flag(p)
        p.add_argument("entry_ids", nargs="*", metavar="ID")
        _fence_flag(p)
        p.add_argument("--all", action="store_true", dest="all_matching", help="every match")
        p.add_argument("--dry-run", action="store_true", help="with --all: only list them")
        p = sub.add_parser("delete", help="delete entries for good")
        p.add_argument("entry_ids", nargs="+", metavar="ID")
        _fence_flag(p)
        p = sub.add_parser("purge", help="delete every entry, or those older than a duration")
        p.add_argument("--older-than", type=_when, metavar="WHEN", help="e.g. 7d")
        p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        p = _filters(sub.add_parser("export", help="whole entries as JSON lines"))
        p.add_argument("--output", metavar="FILE", help="write to FILE instead of stdout")
        _json_flag(sub.add_parser("stats", help="counts by reason and task; oldest, newest"))

    def handle(self, *args: Any, subcommand: str, **options: Any) -> None:
        runs: dict[str, Callable[..., None]] = {
            "list": self._list, "inspect": self._inspect, "release": self._release,
            "delete": self._delete, "purge": self._purge, "export": self._export,
            "stats": self._stats,
        }  # fmt: skip
        run = runs[subcommand]
        try:
            run(**options)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise CommandError(f"cannot reach Redis at {conf.redis_location()}: {exc}") from exc
        except RedisError as exc:
            raise CommandError(f"Redis at {conf.redis_location()} failed: {exc}") from exc
        except OperationalError as exc:
            # core.release put the entry it was sending back in the DLQ.
            raise CommandError(f"cannot reach the Celery broker: {exc}") from exc

    def _json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, ensure_ascii=False))

    def _list(
        self, *, task: str | None, reason: str | None, since: When | None, limit: int,
        cursor: dlq.Cursor | None, as_json: bool, wide: bool, **_: Any,
    ) -> None:  # fmt: skip
        store = dlq.store()
        query = _query(store, task, reason, since)
        page = store.page(query, cursor, limit)
        counts = store.counts()
        matching = counts.matching(query)
        if as_json:
            nxt = None if page.next_cursor is None else str(page.next_cursor)
            entries = [s.to_json() for s in page.entries]
            self._json({"entries": entries, "next_cursor": nxt, "matching": matching})
            return
        if not page.entries:
            empty = counts.total == 0
            self.stdout.write("The dead-letter queue is empty." if empty else "No entries match.")
            return
        rows = [
            (s.id, utc_text(s.failed_at_ms), s.task or "?", s.reason,
             "-" if s.fence is None else str(s.fence), str(s.failures), s.error)
            for s in page.entries
        ]  # fmt: skip
        headers = ("ID", "FAILED AT (UTC)", "TASK", "REASON", "FENCE", "FAILURES", "ERROR")
        # Cut to fit only for eyes on a terminal: piped into grep, a file or a ticket,
        # a cut error is a lost clue, so there the line runs as long as it must.
        cut = self.stdout.isatty() and not wide
        width = shutil.get_terminal_size((_WIDTH, 24)).columns if cut else 0
        for line in _table(headers, rows, right=(4, 5), fit=width):
            self.stdout.write(line)
        shown = len(page.entries)
        total = plural(shown) if matching is None else f"{shown} of {plural(matching)}"
        self.stdout.write(f"\n{total}")
        if page.next_cursor is not None:
            self.stdout.write(f"next page: --cursor {page.next_cursor}")

    def _inspect(self, *, entry_id: str, as_json: bool, **_: Any) -> None:
        entry = dlq.store().get(entry_id)
        if entry is None:
            raise CommandError(f"no DLQ entry {entry_id!r} (released, deleted, or never there)")
        if as_json:
            self._json(entry.to_json())
            return
        s, data = entry.summary, entry.data
        fields = {
            "Entry": s.id, "Task": s.task or "? (not tied to a task)", "Task id": s.task_id,
            "Queue": s.queue or "(default)", "Reason": s.reason,
            "Fence": "-" if s.fence is None else str(s.fence),
            "Attempt": str(data.get("attempt") or "-"), "Worker": data.get("worker") or "-",
            "Failed at": f"{utc_text(s.failed_at_ms)} UTC",
            "First failed": f"{utc_text(s.first_failed_at_ms)} UTC", "Failures": str(s.failures),
        }  # fmt: skip
        for label, value in fields.items():
            self.stdout.write(f"{label + ':':<14}{value}")
        error = ": ".join(str(p) for p in (data.get("exc_type"), data.get("exc_message")) if p)
        self._section("Error", error or s.error or "-")
        self._section("Traceback", (data.get("traceback") or "-").rstrip())
        if entry.envelope is not None:
            self._section("Envelope", json.dumps(entry.envelope, indent=2, ensure_ascii=False))
        else:
            self._section("Raw message (not an envelope)", entry.raw or "-")
        self._section("History", "\n".join(self._history(entry.history)) or "-")

    def _section(self, title: str, body: str) -> None:
        self.stdout.write(f"\n{self.style.MIGRATE_HEADING(title)}\n{body}")

    @staticmethod
    def _history(history: Sequence[dict[str, Any]]) -> list[str]:
        known = {*HISTORY_COLUMNS, "scanner", "reason", "error"}
        rows = []
        for row in history_rows(history):
            h = row.fields
            detail = ": ".join(str(h[k]) for k in ("reason", "error") if h.get(k))
            extra = " ".join(row.pairs(known))
            rows.append((
                "?" if row.at_ms is None else utc_text(row.at_ms), str(h.get("event", "?")),
                str(h.get("fence", "-")), str(h.get("worker") or h.get("scanner") or "-"),
                " ".join(p for p in (detail, extra) if p),
            ))  # fmt: skip
        if not rows:
            return []
        return _table(("TIME (UTC)", "EVENT", "FENCE", "WORKER", "DETAIL"), rows)

    def _release(
        self, *, entry_ids: list[str], fence: int | None, all_matching: bool,
        task: str | None, reason: str | None, since: When | None, dry_run: bool, as_json: bool,
        **_: Any,
    ) -> None:  # fmt: skip
        if bool(entry_ids) == all_matching:
            raise CommandError("give entry ids, or --all and filters (not both)", returncode=2)
        filtered = task is not None or reason is not None or since is not None or dry_run
        if filtered and not all_matching:
            raise CommandError("--task, --reason, --since, --dry-run go with --all", returncode=2)
        pins = [] if all_matching else _one_pin(entry_ids, fence)
        results: list[dict[str, Any]] | None = [] if as_json else None
        try:
            if all_matching:
                self._release_all(_query(dlq.store(), task, reason, since), dry_run, results)
            else:
                self._release_ids(pins, fence, results)
        finally:
            # Printed even when a refusal or the broker ends the command (the error
            # goes to stderr): the entries released before it are released for good.
            if results is not None:
                self._json({"dry_run": dry_run, "results": results})

    def _report(
        self, results: list[dict[str, Any]] | None, line: str, entry_id: str, **outcome: Any
    ) -> None:
        """Print one release's ``line`` now, or with --json add its outcome to ``results``."""
        if results is None:
            self.stdout.write(line)
        else:
            results.append(_outcome(entry_id, **outcome))

    def _release_all(
        self, query: dlq.Query, dry_run: bool, results: list[dict[str, Any]] | None
    ) -> None:
        # Each release is reported as it happens (with --json, into the document that
        # is printed however the command ends): if the broker fails part-way, what was
        # released before it is already reported (the entry it hit stays queued).
        done = dlq.release_where(
            query,
            dry_run=dry_run,
            on_release=lambda i: self._report(results, f"released {i}", i, task_id=i),
        )
        if dry_run:
            for entry_id in done.released:
                self._report(results, f"would release {entry_id}", entry_id)
        for entry_id, why in done.refused:
            self._report(results, self.style.ERROR(f"{entry_id}: {why}"), entry_id, why=why)
        if results is None:
            verb = "would be released (dry run: nothing changed)" if dry_run else "released"
            refused = f"; {len(done.refused)} refused" if done.refused else ""
            self.stdout.write(f"{plural(len(done.released))} {verb}{refused}.")
        if done.refused and not dry_run:
            raise CommandError(f"{plural(len(done.refused))} could not be released")

    def _release_ids(
        self, entry_ids: list[str], fence: int | None, results: list[dict[str, Any]] | None
    ) -> None:
        store = dlq.store()
        failed: list[str] = []
        why = ""
        for entry_id in entry_ids:
            try:
                summary, task_id = _release_one(store, entry_id, fence)
            except dlq.EntryNotReleasable as exc:
                failed.append(entry_id)
                why = exc.reason
                self._report(results, self.style.ERROR(f"{entry_id}: {why}"), entry_id, why=why)
                continue
            done = f"released {entry_id} ({_failure(summary)}) as task {task_id}"
            self._report(results, self.style.SUCCESS(done), entry_id, task_id=task_id)
        if failed:
            # With --fence there is one id: the error itself says which failure it holds.
            detail = "" if fence is None else f": {why}"
            raise CommandError(
                f"not released ({len(failed)} of {len(entry_ids)}): {' '.join(failed)}{detail}"
            )

    def _delete(self, *, entry_ids: list[str], fence: int | None, **_: Any) -> None:
        store = dlq.store()
        pins: dict[str, dlq.Summary] = {}
        unknown: list[str] = []
        refused: list[str] = []
        for entry_id in _one_pin(entry_ids, fence):
            entry = store.get(entry_id)
            if entry is None:
                unknown.append(entry_id)
            elif fence is not None and entry.fence != fence:
                refused.append(f"{entry_id} not deleted: {_not_that_failure(fence, entry.fence)}")
            else:
                pins[entry_id] = entry.summary
        # The fence each entry was read with goes to dlq_delete.lua: a failure that
        # lands between that read and this delete is a task's only record; it stays.
        deleted = set(store.delete(list(pins), [s.fence for s in pins.values()]))
        for entry_id, summary in pins.items():
            if entry_id in deleted:
                self.stdout.write(f"deleted {entry_id} ({_failure(summary)})")
            elif (now := store.get(entry_id)) is None or summary.fence is None:
                unknown.append(entry_id)  # released or deleted meanwhile
            elif now.fence == summary.fence:  # a release that failed to send put it back
                refused.append(f"{entry_id} not deleted: it was being released; run again")
            else:
                why = _not_that_failure(summary.fence, now.fence)
                refused.append(f"{entry_id} not deleted: {why}")
        if unknown:  # last, so a script can match the ids at the end of the line
            refused.append(f"no such DLQ entries: {' '.join(unknown)}")
        if refused:
            raise CommandError("; ".join(refused))

    def _purge(self, *, older_than: When | None, yes: bool, **_: Any) -> None:
        if not yes and (sys.stdin is None or not sys.stdin.isatty()):
            raise CommandError("purge deletes entries for good; stdin is not a terminal to ask "
                               "on, so pass --yes to confirm")  # fmt: skip
        store = dlq.store()
        # The cutoff is fixed before the question: an entry that lands while the
        # operator reads it was not counted, so it is not deleted either.
        cutoff = store.server_time_ms() if older_than is None else older_than.ms(store)
        scope = "" if older_than is None else f" that failed before {utc_text(cutoff)} UTC"
        if not yes:
            count = store.count_failed_before(cutoff)
            if count == 0:
                self.stdout.write(f"Nothing to purge: no entries{scope}.")
                return
            self.stdout.write(f"Delete {plural(count)}{scope} for good? [y/N] ", ending="")
            self.stdout.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                self.stdout.write("Aborted; nothing deleted.")
                return
        deleted = store.purge(cutoff)
        self.stdout.write(self.style.SUCCESS(f"Deleted {plural(deleted)}{scope}."))

    def _export(
        self, *, task: str | None, reason: str | None, since: When | None, output: str | None,
        **_: Any,
    ) -> None:  # fmt: skip
        store = dlq.store()
        entries = store.iter(_query(store, task, reason, since))
        if output is None:
            for entry in entries:
                self.stdout.write(_jsonl(entry))
            return
        count = 0
        try:
            with open(output, "w", encoding="utf-8") as out:
                for entry in entries:
                    out.write(_jsonl(entry) + "\n")
                    count += 1
        except OSError as exc:
            raise CommandError(f"cannot write {output}: {exc.strerror or exc}") from exc
        self.stderr.write(f"Exported {plural(count)} to {output}.", style_func=self.style.SUCCESS)

    def _stats(self, *, as_json: bool, **_: Any) -> None:
        store = dlq.store()
        counts = store.counts()
        oldest_ms, newest_ms = store.span() or (None, None)
        if as_json:
            pairs = sorted(counts.by_reason_and_task.items(), key=lambda kv: (-kv[1], kv[0]))
            self._json({
                "total": counts.total,
                "by_reason": counts.by_reason,
                "by_task": counts.by_task,
                "by_reason_and_task": [{"reason": r, "task": t, "count": n} for (r, t), n in pairs],
                "oldest_failure_at": None if oldest_ms is None else dlq.iso(oldest_ms),
                "newest_failure_at": None if newest_ms is None else dlq.iso(newest_ms),
            })  # fmt: skip
            return
        if counts.total == 0 or oldest_ms is None or newest_ms is None:
            self.stdout.write("The dead-letter queue is empty.")
            return
        self.stdout.write(f"{plural(counts.total)}; failures from {utc_text(oldest_ms)} UTC to "
                          f"{utc_text(newest_ms)} UTC")  # fmt: skip
        by_pair = counts.by_reason_and_task.items()
        tables: list[tuple[tuple[str, ...], dict[tuple[str, ...], int]]] = [
            (("REASON",), {(r,): n for r, n in counts.by_reason.items()}),
            (("TASK",), {(t or "?",): n for t, n in counts.by_task.items()}),
            (("REASON", "TASK"), {(r, t or "?"): n for (r, t), n in by_pair}),
        ]
        for headers, counted in tables:
            ranked = sorted(counted.items(), key=lambda kv: (-kv[1], kv[0]))
            rows = [(*key, str(n)) for key, n in ranked]
            self.stdout.write("")
            for line in _table((*headers, "ENTRIES"), rows, right=(len(headers),)):
                self.stdout.write(line)
