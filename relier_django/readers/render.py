"""How the admin pages and ``manage.py relier_dlq`` show a DLQ entry: its failure
times, "n entries" counts and its incarnation history (which the admin's task page
shows too, for a task still in flight).

What these mean is decided once here; each caller keeps only its own look (an HTML
template in ``admin_views``, aligned text columns in the command). It is apart from
``dlq``, which is the store and release wired to settings and holds no presentation.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..core.model.timing import as_utc, unshowable

# The fields of a history event that both callers show in columns of their own.
HISTORY_COLUMNS = ("at_ms", "event", "fence", "worker")


def utc(ms: int) -> datetime:
    """A DLQ time as an aware datetime.

    Args:
        ms: milliseconds since the epoch, on the Redis clock (every DLQ time is).

    Returns:
        The moment in UTC, to the millisecond.
    """
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def utc_text(ms: int) -> str:
    """A time (ms since the epoch) as ``YYYY-MM-DD HH:MM:SS``, UTC, to the second. A
    time no date holds (a due time stored before pushes were bounded) is shown as the
    number itself (``timing.unshowable``): one such task never fails a whole page."""
    at = as_utc(ms)
    return unshowable(ms) if at is None else at.strftime("%Y-%m-%d %H:%M:%S")


def plural(n: int, word: str = "entry", words: str = "entries") -> str:
    """``n`` and the word that fits it: ``1 entry``, ``0 entries``, ``2 entries``."""
    return f"{n} {word if n == 1 else words}"


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One event of an entry's incarnation history (start, retry, expired,
    resurrected, dead, released…).

    Attributes:
        at_ms: when it happened, ms since the epoch (Redis clock); None if unrecorded.
        fields: the event as recorded, ``at_ms`` included.
    """

    at_ms: int | None
    fields: Mapping[str, Any]

    @property
    def at(self) -> datetime | None:
        """``at_ms`` as a UTC datetime; None if no time was recorded."""
        return None if self.at_ms is None else utc(self.at_ms)

    def pairs(self, shown: Collection[str]) -> list[str]:
        """``key=value`` for each recorded field not in ``shown``, in recorded order."""
        return [f"{k}={v}" for k, v in self.fields.items() if k not in shown]


def history_rows(history: Iterable[Mapping[str, Any]]) -> list[HistoryRow]:
    """An entry's history (``Entry.history``) as rows, one per event, oldest first."""
    return [HistoryRow(None if h.get("at_ms") is None else int(h["at_ms"]), h) for h in history]


def history_table(history: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A history as the admin's history table shows it (the DLQ entry page and the task
    page): per event its time, event, fence, worker, the cause of a death (an
    ``expired`` or ``died`` event: ``oom``, ``signal:SIGKILL``, ...; docs/worker-death.md)
    and every other field as details."""
    return [
        {
            "at": row.at,
            "event": row.fields.get("event", ""),
            "fence": row.fields.get("fence"),
            "worker": row.fields.get("worker"),
            "cause": row.fields.get("cause", ""),
            "details": ", ".join(row.pairs((*HISTORY_COLUMNS, "cause"))),
        }
        for row in history_rows(history)
    ]
